/* <math.h> for NVRTC (see README.md). The math functions (sqrtf, expf, isnan...) are NVRTC's
   own; this adds the constants of glibc's <math.h>. */
#ifndef COURSE_NVRTC_MATH_H
#define COURSE_NVRTC_MATH_H
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#ifndef HUGE_VALF
#define HUGE_VALF INFINITY
#endif
#ifndef HUGE_VAL
#define HUGE_VAL __longlong_as_double(0x7ff0000000000000LL)
#endif
#ifndef M_E
#define M_E 2.7182818284590452354   /* e */
#endif
#ifndef M_LOG2E
#define M_LOG2E 1.4426950408889634074   /* log2(e) */
#endif
#ifndef M_LOG10E
#define M_LOG10E 0.43429448190325182765  /* log10(e) */
#endif
#ifndef M_LN2
#define M_LN2 0.69314718055994530942  /* ln(2) */
#endif
#ifndef M_LN10
#define M_LN10 2.30258509299404568402  /* ln(10) */
#endif
#ifndef M_PI
#define M_PI 3.14159265358979323846  /* pi */
#endif
#ifndef M_PI_2
#define M_PI_2 1.57079632679489661923  /* pi/2 */
#endif
#ifndef M_PI_4
#define M_PI_4 0.78539816339744830962  /* pi/4 */
#endif
#ifndef M_1_PI
#define M_1_PI 0.31830988618379067154  /* 1/pi */
#endif
#ifndef M_2_PI
#define M_2_PI 0.63661977236758134308  /* 2/pi */
#endif
#ifndef M_2_SQRTPI
#define M_2_SQRTPI 1.12837916709551257390  /* 2/sqrt(pi) */
#endif
#ifndef M_SQRT2
#define M_SQRT2 1.41421356237309504880  /* sqrt(2) */
#endif
#ifndef M_SQRT1_2
#define M_SQRT1_2 0.70710678118654752440  /* 1/sqrt(2) */
#endif
#endif
