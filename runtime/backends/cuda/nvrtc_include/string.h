/* <string.h> for NVRTC (see README.md). memcpy and memset are NVRTC's own; the rest exists
   only on the host: a kernel that calls one is refused at its line. */
#ifndef COURSE_NVRTC_STRING_H
#define COURSE_NVRTC_STRING_H
#define COURSE_HOST_ONLY(decl) __device__ decl = delete;
COURSE_HOST_ONLY(int memcmp(const void *, const void *, unsigned long))
COURSE_HOST_ONLY(void *memmove(void *, const void *, unsigned long))
COURSE_HOST_ONLY(unsigned long strlen(const char *))
COURSE_HOST_ONLY(int strcmp(const char *, const char *))
COURSE_HOST_ONLY(int strncmp(const char *, const char *, unsigned long))
COURSE_HOST_ONLY(char *strcpy(char *, const char *))
COURSE_HOST_ONLY(char *strncpy(char *, const char *, unsigned long))
COURSE_HOST_ONLY(char *strcat(char *, const char *))
COURSE_HOST_ONLY(char *strchr(const char *, int))
COURSE_HOST_ONLY(char *strstr(const char *, const char *))
COURSE_HOST_ONLY(char *strdup(const char *))
COURSE_HOST_ONLY(char *strerror(int))
#undef COURSE_HOST_ONLY
#endif
