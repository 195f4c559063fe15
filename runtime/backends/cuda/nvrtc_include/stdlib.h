/* <stdlib.h> for NVRTC (see README.md). malloc and free are NVRTC's own (the device heap);
   abs, labs and llabs too. The rest exists only on the host: a kernel that calls one is
   refused at its line. */
#ifndef COURSE_NVRTC_STDLIB_H
#define COURSE_NVRTC_STDLIB_H
/* glibc's <stdlib.h> brings <sys/types.h>, whose short names published kernels use */
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned long ulong;
#define EXIT_SUCCESS 0
#define EXIT_FAILURE 1
#define RAND_MAX 2147483647
#define COURSE_HOST_ONLY(decl) __device__ decl = delete;
COURSE_HOST_ONLY(void *calloc(unsigned long, unsigned long))
COURSE_HOST_ONLY(void *realloc(void *, unsigned long))
COURSE_HOST_ONLY(void exit(int))
COURSE_HOST_ONLY(void abort(void))
COURSE_HOST_ONLY(int atexit(void (*)(void)))
COURSE_HOST_ONLY(int rand(void))
COURSE_HOST_ONLY(void srand(unsigned int))
COURSE_HOST_ONLY(int atoi(const char *))
COURSE_HOST_ONLY(long atol(const char *))
COURSE_HOST_ONLY(double atof(const char *))
COURSE_HOST_ONLY(long strtol(const char *, char **, int))
COURSE_HOST_ONLY(double strtod(const char *, char **))
COURSE_HOST_ONLY(char *getenv(const char *))
COURSE_HOST_ONLY(int system(const char *))
COURSE_HOST_ONLY(void qsort(void *, unsigned long, unsigned long, int (*)(const void *, const void *)))
#undef COURSE_HOST_ONLY
#endif
