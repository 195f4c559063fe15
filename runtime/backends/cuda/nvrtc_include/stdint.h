/* <stdint.h> for NVRTC (see README.md): fixed-width integer types and their limits. */
#ifndef COURSE_NVRTC_STDINT_H
#define COURSE_NVRTC_STDINT_H
#if __has_include(<cuda/std/cstdint>)
/* libcu++ (CUDA's CCCL headers) is there: its <cstdint>, as <cooperative_groups.h> uses it */
#include <cuda/std/cstdint>
using cuda::std::int8_t; using cuda::std::uint8_t; using cuda::std::int16_t; using cuda::std::uint16_t;
using cuda::std::int32_t; using cuda::std::uint32_t; using cuda::std::int64_t; using cuda::std::uint64_t;
using cuda::std::intptr_t; using cuda::std::uintptr_t; using cuda::std::intmax_t; using cuda::std::uintmax_t;
#else
typedef signed char int8_t; typedef unsigned char uint8_t;
typedef short int16_t; typedef unsigned short uint16_t;
typedef int int32_t; typedef unsigned int uint32_t;
typedef long int64_t; typedef unsigned long uint64_t;  /* as in glibc on 64-bit Linux */
typedef long intptr_t; typedef unsigned long uintptr_t;
typedef long intmax_t; typedef unsigned long uintmax_t;
#endif
#ifndef INT8_MAX
#define INT8_MIN (-128)
#define INT8_MAX 127
#define UINT8_MAX 255
#define INT16_MIN (-32768)
#define INT16_MAX 32767
#define UINT16_MAX 65535
#define INT32_MIN (-2147483647 - 1)
#define INT32_MAX 2147483647
#define UINT32_MAX 4294967295U
#define INT64_MIN (-9223372036854775807L - 1)
#define INT64_MAX 9223372036854775807L
#define UINT64_MAX 18446744073709551615UL
#endif
#ifndef SIZE_MAX
#define SIZE_MAX 18446744073709551615UL
#endif
#ifndef INTPTR_MAX
#define INTPTR_MAX INT64_MAX
#define UINTPTR_MAX UINT64_MAX
#endif
#endif
