/* <stdio.h> for NVRTC (see README.md). printf is NVRTC's own (device printf). The file
   functions exist only on the host: a kernel that calls one is refused at its line. */
#ifndef COURSE_NVRTC_STDIO_H
#define COURSE_NVRTC_STDIO_H
typedef struct _IO_FILE FILE;
#ifndef EOF
#define EOF (-1)
#endif
#define COURSE_HOST_ONLY(decl) __device__ decl = delete;
COURSE_HOST_ONLY(FILE *fopen(const char *, const char *))
COURSE_HOST_ONLY(int fclose(FILE *))
COURSE_HOST_ONLY(int fflush(FILE *))
COURSE_HOST_ONLY(int fprintf(FILE *, const char *, ...))
COURSE_HOST_ONLY(int sprintf(char *, const char *, ...))
COURSE_HOST_ONLY(int snprintf(char *, unsigned long, const char *, ...))
COURSE_HOST_ONLY(int scanf(const char *, ...))
COURSE_HOST_ONLY(int fscanf(FILE *, const char *, ...))
COURSE_HOST_ONLY(unsigned long fread(void *, unsigned long, unsigned long, FILE *))
COURSE_HOST_ONLY(unsigned long fwrite(const void *, unsigned long, unsigned long, FILE *))
COURSE_HOST_ONLY(int fseek(FILE *, long, int))
COURSE_HOST_ONLY(long ftell(FILE *))
COURSE_HOST_ONLY(int puts(const char *))
COURSE_HOST_ONLY(int putchar(int))
COURSE_HOST_ONLY(int getchar(void))
COURSE_HOST_ONLY(void perror(const char *))
#undef COURSE_HOST_ONLY
#endif
