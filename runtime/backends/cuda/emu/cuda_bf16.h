// cuda_bf16.h for the course's CPU emulator: __nv_bfloat16, __nv_bfloat162 and the common
// intrinsics. bfloat16 is the top half of a float32 (8 exponent bits, 8 significant bits):
// the range of float, the precision of about 2-3 decimal digits. Storage is that bit
// pattern, so a torch.bfloat16 tensor can be passed as `const __nv_bfloat16*`. Arithmetic
// converts to float, computes and rounds back to nearest even, as a GPU does.
#pragma once
#include "cuda_fp16.h"

namespace emu_bf16 {
inline unsigned short float_to_bf16_bits(float f) {
    unsigned x; memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);  // NaN stays NaN
    x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even (overflow rounds to inf)
    return (unsigned short)(x >> 16);
}
inline float bf16_bits_to_float(unsigned short b) { unsigned x = (unsigned)b << 16; float f; memcpy(&f, &x, 4); return f; }
}  // namespace emu_bf16

struct __nv_bfloat16_raw { unsigned short x; };

struct alignas(2) __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(emu_bf16::float_to_bf16_bits(f)) {}
    __nv_bfloat16(double f) : __x(emu_bf16::float_to_bf16_bits((float)f)) {}
    __nv_bfloat16(int i) : __x(emu_bf16::float_to_bf16_bits((float)i)) {}
    __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
    operator float() const { return emu_bf16::bf16_bits_to_float(__x); }
    operator __nv_bfloat16_raw() const { return {__x}; }
    __nv_bfloat16& operator=(float f) { __x = emu_bf16::float_to_bf16_bits(f); return *this; }
    __nv_bfloat16& operator+=(__nv_bfloat16 o) { return *this = (float)*this + (float)o; }
    __nv_bfloat16& operator-=(__nv_bfloat16 o) { return *this = (float)*this - (float)o; }
    __nv_bfloat16& operator*=(__nv_bfloat16 o) { return *this = (float)*this * (float)o; }
    __nv_bfloat16& operator/=(__nv_bfloat16 o) { return *this = (float)*this / (float)o; }
};
typedef __nv_bfloat16 nv_bfloat16;

struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
    __nv_bfloat162() = default;
    __nv_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) : x(a), y(b) {}
};
typedef __nv_bfloat162 nv_bfloat162;

typedef __nv_bfloat16 emu_bf;
inline emu_bf operator+(emu_bf a, emu_bf b) { return emu_bf((float)a + (float)b); }
inline emu_bf operator-(emu_bf a, emu_bf b) { return emu_bf((float)a - (float)b); }
inline emu_bf operator*(emu_bf a, emu_bf b) { return emu_bf((float)a * (float)b); }
inline emu_bf operator/(emu_bf a, emu_bf b) { return emu_bf((float)a / (float)b); }
inline emu_bf operator-(emu_bf a) { emu_bf r = a; r.__x ^= 0x8000u; return r; }
inline bool operator==(emu_bf a, emu_bf b) { return (float)a == (float)b; }
inline bool operator!=(emu_bf a, emu_bf b) { return (float)a != (float)b; }
inline bool operator<(emu_bf a, emu_bf b) { return (float)a < (float)b; }
inline bool operator<=(emu_bf a, emu_bf b) { return (float)a <= (float)b; }
inline bool operator>(emu_bf a, emu_bf b) { return (float)a > (float)b; }
inline bool operator>=(emu_bf a, emu_bf b) { return (float)a >= (float)b; }
inline __nv_bfloat162 operator+(__nv_bfloat162 a, __nv_bfloat162 b) { return {a.x + b.x, a.y + b.y}; }
inline __nv_bfloat162 operator*(__nv_bfloat162 a, __nv_bfloat162 b) { return {a.x * b.x, a.y * b.y}; }

inline emu_bf __float2bfloat16(float f) { return emu_bf(f); }
inline emu_bf __float2bfloat16_rn(float f) { return emu_bf(f); }
inline float __bfloat162float(emu_bf b) { return (float)b; }
inline emu_bf __double2bfloat16(double d) { return emu_bf((float)d); }
inline emu_bf __int2bfloat16_rn(int i) { return emu_bf((float)i); }
inline int __bfloat162int_rz(emu_bf b) { return (int)(float)b; }
inline emu_bf __ushort_as_bfloat16(unsigned short u) { emu_bf b; b.__x = u; return b; }
inline unsigned short __bfloat16_as_ushort(emu_bf b) { return b.__x; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {emu_bf(a), emu_bf(b)}; }
inline __nv_bfloat162 __float2bfloat162_rn(float a) { return {emu_bf(a), emu_bf(a)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {(float)h.x, (float)h.y}; }
inline __nv_bfloat162 __halves2bfloat162(emu_bf a, emu_bf b) { return {a, b}; }
inline emu_bf __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline emu_bf __high2bfloat16(__nv_bfloat162 h) { return h.y; }
inline emu_bf __hadd(emu_bf a, emu_bf b) { return a + b; }
inline emu_bf __hsub(emu_bf a, emu_bf b) { return a - b; }
inline emu_bf __hmul(emu_bf a, emu_bf b) { return a * b; }
inline emu_bf __hdiv(emu_bf a, emu_bf b) { return a / b; }
inline emu_bf __hneg(emu_bf a) { return -a; }
inline emu_bf __habs(emu_bf a) { emu_bf r = a; r.__x &= 0x7fffu; return r; }
inline emu_bf __hfma(emu_bf a, emu_bf b, emu_bf c) { return emu_bf(fmaf((float)a, (float)b, (float)c)); }
inline emu_bf __hmax(emu_bf a, emu_bf b) { return (float)a >= (float)b || b != b ? a : b; }
inline emu_bf __hmin(emu_bf a, emu_bf b) { return (float)a <= (float)b || b != b ? a : b; }
inline bool __hisnan(emu_bf a) { return (a.__x & 0x7fffu) > 0x7f80u; }
inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) { return a + b; }
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) { return a * b; }
inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
    return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}

// Tensor arguments: `const __nv_bfloat16*` takes a torch.bfloat16 tensor (type code "E").
namespace emu __attribute__((visibility("hidden"))) {
template <> struct tcode<__nv_bfloat16> { static const char* get() { return "E"; } };
}
