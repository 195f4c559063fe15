/* <assert.h> for NVRTC (see README.md): NVRTC has assert() built in (a failed assert in a
   kernel stops it and reports the file and line). Nothing more is needed. */
