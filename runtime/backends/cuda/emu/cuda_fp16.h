// cuda_fp16.h for the course's CPU emulator: __half, half2 and the common intrinsics.
//
// A kernel that writes `#include <cuda_fp16.h>` gets this file in simulation (the GPU
// build gets NVIDIA's). Storage is the IEEE binary16 bit pattern, as on a GPU, so a torch
// float16 tensor can be passed as `const __half*`. Arithmetic converts to float, computes
// and rounds back to nearest-even: for +, -, *, / and fma that gives the correctly rounded
// half result a GPU gives (float has more than twice half's 11 significant bits).
// Conversions round to nearest even, keep infinities and NaN, and handle subnormals.
#pragma once
#include <string.h>
#include <math.h>

namespace emu_fp16 {
inline unsigned short float_to_half_bits(float f) {
    unsigned x; memcpy(&x, &f, 4);
    unsigned sign = (x >> 16) & 0x8000u;
    unsigned absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u)  // inf or NaN (NaN keeps a quiet payload bit)
        return (unsigned short)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0u));
    if (absx >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds past 65504: inf
    if (absx < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
        if (absx < 0x33000000u) return (unsigned short)sign;  // below half of 2^-24: 0
        unsigned mant = (absx & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(absx >> 23);  // 14..24 (113 - exp) + 13
        unsigned q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) ++q;
        return (unsigned short)(sign | q);
    }
    unsigned q = (absx - 0x38000000u) >> 13;  // rebias the exponent 127 -> 15
    unsigned rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;  // may carry into the exponent: fine
    return (unsigned short)(sign | q);
}
inline float half_bits_to_float(unsigned short h) {
    unsigned sign = (unsigned)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (exp == 0x1fu) x = sign | 0x7f800000u | (mant << 13);
    else if (exp != 0) x = sign | ((exp + 112u) << 23) | (mant << 13);
    else if (mant == 0) x = sign;
    else {  // subnormal: normalize
        int e = -1;
        do { mant <<= 1; ++e; } while (!(mant & 0x400u));
        x = sign | ((unsigned)(112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
    float f; memcpy(&f, &x, 4); return f;
}
}  // namespace emu_fp16

struct __half_raw { unsigned short x; };

struct alignas(2) __half {
    unsigned short __x;
    __half() = default;
    __half(float f) : __x(emu_fp16::float_to_half_bits(f)) {}
    __half(double f) : __x(emu_fp16::float_to_half_bits((float)f)) {}
    __half(int i) : __x(emu_fp16::float_to_half_bits((float)i)) {}
    __half(unsigned i) : __x(emu_fp16::float_to_half_bits((float)i)) {}
    __half(long long i) : __x(emu_fp16::float_to_half_bits((float)i)) {}
    __half(const __half_raw& r) : __x(r.x) {}
    operator float() const { return emu_fp16::half_bits_to_float(__x); }
    operator __half_raw() const { return {__x}; }
    __half& operator=(float f) { __x = emu_fp16::float_to_half_bits(f); return *this; }
    __half& operator+=(__half o) { return *this = (float)*this + (float)o; }
    __half& operator-=(__half o) { return *this = (float)*this - (float)o; }
    __half& operator*=(__half o) { return *this = (float)*this * (float)o; }
    __half& operator/=(__half o) { return *this = (float)*this / (float)o; }
};
typedef __half half;

struct alignas(4) __half2 {
    __half x, y;
    __half2() = default;
    __half2(__half a, __half b) : x(a), y(b) {}
};
typedef __half2 half2;

// Arithmetic and comparisons of two halves give a half (or a bool), as on a GPU; a half
// meeting a float converts to float (the implicit conversion above).
inline __half operator+(__half a, __half b) { return __half((float)a + (float)b); }
inline __half operator-(__half a, __half b) { return __half((float)a - (float)b); }
inline __half operator*(__half a, __half b) { return __half((float)a * (float)b); }
inline __half operator/(__half a, __half b) { return __half((float)a / (float)b); }
inline __half operator-(__half a) { __half r = a; r.__x ^= 0x8000u; return r; }
inline bool operator==(__half a, __half b) { return (float)a == (float)b; }
inline bool operator!=(__half a, __half b) { return (float)a != (float)b; }
inline bool operator<(__half a, __half b) { return (float)a < (float)b; }
inline bool operator<=(__half a, __half b) { return (float)a <= (float)b; }
inline bool operator>(__half a, __half b) { return (float)a > (float)b; }
inline bool operator>=(__half a, __half b) { return (float)a >= (float)b; }
inline __half2 operator+(__half2 a, __half2 b) { return {a.x + b.x, a.y + b.y}; }
inline __half2 operator-(__half2 a, __half2 b) { return {a.x - b.x, a.y - b.y}; }
inline __half2 operator*(__half2 a, __half2 b) { return {a.x * b.x, a.y * b.y}; }
inline __half2 operator/(__half2 a, __half2 b) { return {a.x / b.x, a.y / b.y}; }

// Conversions. Only round-to-nearest-even is emulated exactly; _rz/_rd/_ru conversions
// from float round toward zero / down / up as their names say.
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __float2half_rz(float f) {
    __half h(f);
    if (fabsf((float)h) > fabsf(f) && !isinf(f)) h.__x -= 1;  // one step back toward zero
    return h;
}
inline __half __double2half(double d) { return __half((float)d); }
inline float __half2float(__half h) { return (float)h; }
inline __half __int2half_rn(int i) { return __half((float)i); }
inline int __half2int_rz(__half h) { return (int)(float)h; }
inline int __half2int_rn(__half h) { return (int)nearbyintf((float)h); }
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return (short)h.__x; }
inline __half __short_as_half(short s) { __half h; h.__x = (unsigned short)s; return h; }
inline __half2 __float2half2_rn(float f) { return {__half(f), __half(f)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline __half2 __float22half2_rn(float2 f) { return {__half(f.x), __half(f.y)}; }
inline float2 __half22float2(__half2 h) { return {(float)h.x, (float)h.y}; }
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __half2 __half2half2(__half a) { return {a, a}; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline float __low2float(__half2 h) { return (float)h.x; }
inline float __high2float(__half2 h) { return (float)h.y; }
inline __half2 __lows2half2(__half2 a, __half2 b) { return {a.x, b.x}; }
inline __half2 __highs2half2(__half2 a, __half2 b) { return {a.y, b.y}; }

// Intrinsics.
inline __half __hadd(__half a, __half b) { return a + b; }
inline __half __hsub(__half a, __half b) { return a - b; }
inline __half __hmul(__half a, __half b) { return a * b; }
inline __half __hdiv(__half a, __half b) { return a / b; }
inline __half __hneg(__half a) { return -a; }
inline __half __habs(__half a) { __half r = a; r.__x &= 0x7fffu; return r; }
inline __half __hfma(__half a, __half b, __half c) { return __half(fmaf((float)a, (float)b, (float)c)); }
inline __half __hmax(__half a, __half b) { return (float)a >= (float)b || b != b ? a : b; }
inline __half __hmin(__half a, __half b) { return (float)a <= (float)b || b != b ? a : b; }
inline bool __heq(__half a, __half b) { return a == b; }
inline bool __hne(__half a, __half b) { return a != b; }
inline bool __hlt(__half a, __half b) { return a < b; }
inline bool __hle(__half a, __half b) { return a <= b; }
inline bool __hgt(__half a, __half b) { return a > b; }
inline bool __hge(__half a, __half b) { return a >= b; }
inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
inline int __hisinf(__half a) { return (a.__x & 0x7fffu) == 0x7c00u ? (a.__x & 0x8000u ? -1 : 1) : 0; }
inline __half hexp(__half a) { return __half(expf((float)a)); }
inline __half hlog(__half a) { return __half(logf((float)a)); }
inline __half hsqrt(__half a) { return __half(sqrtf((float)a)); }
inline __half hrsqrt(__half a) { return __half(1.0f / sqrtf((float)a)); }
inline __half hrcp(__half a) { return __half(1.0f / (float)a); }
inline __half htanh(__half a) { return __half(tanhf((float)a)); }
inline __half2 __hadd2(__half2 a, __half2 b) { return a + b; }
inline __half2 __hsub2(__half2 a, __half2 b) { return a - b; }
inline __half2 __hmul2(__half2 a, __half2 b) { return a * b; }
inline __half2 __h2div(__half2 a, __half2 b) { return a / b; }
inline __half2 __hneg2(__half2 a) { return {-a.x, -a.y}; }
inline __half2 __habs2(__half2 a) { return {__habs(a.x), __habs(a.y)}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)}; }
inline __half2 __hmax2(__half2 a, __half2 b) { return {__hmax(a.x, b.x), __hmax(a.y, b.y)}; }
inline __half2 __hmin2(__half2 a, __half2 b) { return {__hmin(a.x, b.x), __hmin(a.y, b.y)}; }

// A warp shuffle moves a half or a half2 like any value of up to 8 bytes (cuda_emu.h).
// Tensor arguments: `const __half*` takes a torch.float16 tensor (type code "e").
namespace emu __attribute__((visibility("hidden"))) {
template <> struct tcode<__half> { static const char* get() { return "e"; } };
}
