// What both quantized linear layers (groups.cpp, superblock.cpp) share: the code paths and
// their CPU checks, activation codes for a group of 32, the packed codes' loads and exact
// integer dot products per path, and writing a block of outputs; and exp for the kernels
// that need one (attention.cpp, layer.cpp).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace quickdraft_simd {

constexpr int64_t kGroup = 32;  // inputs a group
constexpr int64_t kLanes = 16;  // outputs a block

// Both weight kernels walk a thread's blocks front to back, a group's record at a time, and
// ask for the lines this far ahead of the one they are on, into L1, every line once. The
// hardware prefetcher alone kept a core at 60-65% of the memory's rate on one row and
// starved the tiles that compute longer per byte; on the 1.5B's projections and head,
// streamed (Intel Xeon, 2 threads), 2,048-4,096 bytes ahead made the superblock kernel's one
// row 1.2x, two 1.4x, three 1.5x and 4-16 rows 1.05-1.1x faster than that (and than
// prefetching the next block's group, which tiles of 4+ rows did before), its AVX2 path's
// one row 1.26x and eight 1.6x (`benchmarks/results/quant_kernels_prefetch/`). Prefetches do
// not fault, so those past a buffer's end are harmless.
constexpr int64_t kAheadBytes = 3072;

inline void prefetch_ahead(const uint8_t* at, int lines) {
  const char* ahead = reinterpret_cast<const char*>(at) + kAheadBytes;
  for (int line = 0; line < lines; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
}

// Whether a tile of ``rows`` rows should prefetch ahead. On AMD's EPYC (Zen 4, 2 threads) the
// hardware prefetcher alone keeps one row ahead of the memory: swept in one process, the 1.5B's
// projections streamed, one row took 22.9 ms with no prefetch against 25.4-27.2 at 1-6 KB ahead
// (AVX2 33.8 against 38.5-40.5), while two rows gained 1.1x and eight 1.6x from it
// (`benchmarks/results/quant_kernels_prefetch/`); whole decode steps of the 1.5B, the 0.5B and
// SmolLM2 ran 1.05x, 1.03x and 1.07x faster without it. On the Intel Xeon one row gained 1.2x.
inline bool ahead_pays(int rows) {
  static const bool amd = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") != 0;
  }();
  return rows > 1 || !amd;
}

// kAvxVnni: 256-bit vectors with vpdpbusd, VEX encoded (AVX-VNNI) where the CPU has it, else
// EVEX (AVX-512 VNNI with VL).
enum Path : int64_t { kAuto = 0, kAvx512Vnni = 1, kAvx2 = 2, kAvxVnni = 3 };

// Compilers that know AVX-VNNI (its intrinsics and CPU check): GCC 11 and Clang 12 on.
#if (defined(__clang__) && __clang_major__ >= 12) || \
    (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define QD_HAS_AVXVNNI 1
#else
#define QD_HAS_AVXVNNI 0
#endif

inline bool has_vex_vnni() {
#if QD_HAS_AVXVNNI
  __builtin_cpu_init();
  return __builtin_cpu_supports("avxvnni");
#else
  return false;  // built without it: the EVEX form stands in where the CPU has AVX-512 VNNI
#endif
}

inline bool supported(int64_t path) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  switch (path) {
    case kAvx512Vnni:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    case kAvx2:
      return avx2;
    case kAvxVnni:
      return avx2 && (has_vex_vnni() || (__builtin_cpu_supports("avx512vl") &&
                                         __builtin_cpu_supports("avx512vnni")));
    default:
      return false;
  }
}

// The largest |x| of n floats (n a multiple of 8).
__attribute__((target("avx2,fma,f16c"))) inline float absmax(const float* xs, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 top = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    top = _mm256_max_ps(top, _mm256_andnot_ps(sign, _mm256_loadu_ps(xs + i)));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// 32 activations to codes nearbyint(x * (127 / amax)) (round half to even, clamped to
// -127..127), as the PyTorch references compute them; returns the sum of the codes.
__attribute__((target("avx2,fma,f16c"))) inline int32_t quantize_group(const float* xs,
                                                                      float amax,
                                                                      int8_t* codes) {
  const __m256 inverse = _mm256_set1_ps(127.0f / amax);
  const __m256 high = _mm256_set1_ps(127.0f), low = _mm256_set1_ps(-127.0f);
  __m256i q[4];
  __m256i total = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    __m256 c = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xs + 8 * i), inverse),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    c = _mm256_min_ps(high, _mm256_max_ps(low, c));
    q[i] = _mm256_cvtps_epi32(c);
    total = _mm256_add_epi32(total, q[i]);
  }
  // Packing works within 128-bit lanes: put the 4-byte pieces back in order.
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                            _mm256_packs_epi32(q[2], q[3]));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes),
                      _mm256_permutevar8x32_epi32(packed, order));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  return _mm_cvtsi128_si32(t);
}

// acc + the dot products of each 32-bit lane of w (4 unsigned bytes) with the 4 signed bytes
// at p, broadcast from memory inside the instruction (compilers do not fold the broadcast, and
// a separate one costs an instruction per product).
__attribute__((target("avx512f,avx512vnni"))) inline __m512i dpbusd_broadcast(__m512i acc,
                                                                           __m512i w,
                                                                           const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(w), "m"(*reinterpret_cast<const int32_t(*)[1]>(p)));
  return acc;
}

// One group's codes for a block of 16 outputs, as VNNI multiplies them: w[2c] and w[2c + 1]
// against the activation bytes at 8c and 8c + 4. 4 bits: chunk c (of 4, 64 bytes each) holds
// inputs 8c..8c+3 in its low nibbles, 8c+4..8c+7 in its high ones; 8 bits: chunk c (of 8)
// holds inputs 4c..4c+3.
// 6 bits: the low 4 as the 4-bit chunks, then two 64-byte planes of the high 2, plane P's byte
// b holding those of w[4P + i] at byte b in its bits 2i..2i+1.
template <int Bits>
__attribute__((target("avx512f,avx512bw"))) inline void load_codes(const uint8_t* codes,
                                                                   __m512i w[8]) {
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  for (int c = 0; c < 4; ++c) {
    if constexpr (Bits == 8) {
      w[2 * c] = _mm512_loadu_si512(codes + 128 * c);
      w[2 * c + 1] = _mm512_loadu_si512(codes + 128 * c + 64);
    } else {
      const __m512i v = _mm512_loadu_si512(codes + 64 * c);
      w[2 * c] = _mm512_and_si512(v, low_mask);
      w[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low_mask);
    }
  }
  if constexpr (Bits == 6) {
    const __m512i high_mask = _mm512_set1_epi8(0x30);
    for (int plane = 0; plane < 2; ++plane) {
      const __m512i h = _mm512_loadu_si512(codes + 256 + 64 * plane);
      __m512i* v = w + 4 * plane;
      // v |= bits 2i..2i+1 of h, moved to bits 4..5 (16-bit shifts: the mask drops what
      // crosses from the neighbouring byte). 0xF8: a | (b & c).
      v[0] = _mm512_ternarylogic_epi32(v[0], _mm512_slli_epi16(h, 4), high_mask, 0xF8);
      v[1] = _mm512_ternarylogic_epi32(v[1], _mm512_slli_epi16(h, 2), high_mask, 0xF8);
      v[2] = _mm512_ternarylogic_epi32(v[2], h, high_mask, 0xF8);
      v[3] = _mm512_ternarylogic_epi32(v[3], _mm512_srli_epi16(h, 2), high_mask, 0xF8);
    }
  }
}

// The 16 dot products of one group with the 32 activation codes at p, exact in int32.
template <int Bits>
__attribute__((target("avx512f,avx512vnni"))) inline __m512i dot_avx512(const __m512i w[8],
                                                                        const int8_t* p) {
  __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
  for (int c = 0; c < 4; ++c) {
    d0 = dpbusd_broadcast(d0, w[2 * c], p + 8 * c);
    d1 = dpbusd_broadcast(d1, w[2 * c + 1], p + 8 * c + 4);
  }
  return _mm512_add_epi32(d0, d1);
}

// ``dot_avx512`` as one chain of dependent products: one operation fewer, for callers that
// interleave several rows' chains.
template <int Bits>
__attribute__((target("avx512f,avx512vnni"))) inline __m512i dot_avx512_chain(const __m512i w[8],
                                                                              const int8_t* p) {
  __m512i d = _mm512_setzero_si512();
  for (int c = 0; c < 4; ++c) {
    d = dpbusd_broadcast(d, w[2 * c], p + 8 * c);
    d = dpbusd_broadcast(d, w[2 * c + 1], p + 8 * c + 4);
  }
  return d;
}

// ``dot_avx512`` split at 16 inputs (6-bit codes with a sub-scale per 16, ``kQ6K``): lo holds
// inputs 0..15 (chunks 0 and 1), hi inputs 16..31, each one chain.
__attribute__((target("avx512f,avx512vnni"))) inline void dot_avx512_halves(const __m512i w[8],
                                                                           const int8_t* p,
                                                                           __m512i& lo,
                                                                           __m512i& hi) {
  lo = _mm512_setzero_si512();
  hi = _mm512_setzero_si512();
  for (int c = 0; c < 2; ++c) {
    lo = dpbusd_broadcast(lo, w[2 * c], p + 8 * c);
    lo = dpbusd_broadcast(lo, w[2 * c + 1], p + 8 * c + 4);
    hi = dpbusd_broadcast(hi, w[2 * c + 4], p + 8 * c + 16);
    hi = dpbusd_broadcast(hi, w[2 * c + 5], p + 8 * c + 20);
  }
}

// The AVX2 path works on 8 outputs (half a block, the 32-byte half of each chunk) at a time.
// 4 bits: lo[c], hi[c] multiply the activations at 8c and 8c + 4; 8 bits: chunk c's low and
// high nibbles, both against the activations at 4c.
template <int Bits>
constexpr int kAvx2Chunks = Bits == 8 ? 8 : 4;

// 6 bits: the 4-bit chunks' nibbles, then the high 2 bits from the planes (``load_codes``):
// lo[c] is w[2c], hi[c] is w[2c + 1].
template <int Bits>
__attribute__((target("avx2"))) inline void load_codes_avx2(const uint8_t* codes, int half,
                                                            __m256i* lo, __m256i* hi) {
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  for (int c = 0; c < kAvx2Chunks<Bits>; ++c) {
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * c + 32 * half));
    lo[c] = _mm256_and_si256(v, low_mask);
    hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_mask);
  }
  if constexpr (Bits == 6) {
    const __m256i high_mask = _mm256_set1_epi8(0x30);
    for (int plane = 0; plane < 2; ++plane) {
      const __m256i h = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(codes + 256 + 64 * plane + 32 * half));
      __m256i* even = lo + 2 * plane;  // w[4P] = lo[2P], w[4P + 1] = hi[2P], ...
      __m256i* odd = hi + 2 * plane;
      even[0] = _mm256_or_si256(even[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), high_mask));
      odd[0] = _mm256_or_si256(odd[0], _mm256_and_si256(_mm256_slli_epi16(h, 2), high_mask));
      even[1] = _mm256_or_si256(even[1], _mm256_and_si256(h, high_mask));
      odd[1] = _mm256_or_si256(odd[1], _mm256_and_si256(_mm256_srli_epi16(h, 2), high_mask));
    }
  }
}

// Chunks [first, last) of 4- or 6-bit codes against the activations at p (chunk c's inputs
// 8c..8c+7): dot_avx2's sums, or half of them for a sub-scale per 16 (chunks 0-1, 2-3).
__attribute__((target("avx2"))) inline __m256i dot_avx2_chunks(const __m256i* lo,
                                                               const __m256i* hi,
                                                               const int8_t* p, int first,
                                                               int last) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i d = _mm256_setzero_si256();
  for (int c = first; c < last; ++c) {
    int32_t first4, second4;
    std::memcpy(&first4, p + 8 * c, 4);
    std::memcpy(&second4, p + 8 * c + 4, 4);
    const __m256i a0 = _mm256_maddubs_epi16(lo[c], _mm256_set1_epi32(first4));
    const __m256i a1 = _mm256_maddubs_epi16(hi[c], _mm256_set1_epi32(second4));
    d = _mm256_add_epi32(d, _mm256_madd_epi16(_mm256_add_epi16(a0, a1), ones));
  }
  return d;
}

// u8 x s8 pairs into int16, then pairs into int32: the dot products VNNI computes. The int16
// pair sums are exact for 4- and 6-bit codes (2 * 63 * 127 < 2^15); 8-bit codes go as their
// two nibbles, 16 * dot(high) + dot(low), for the same reason.
template <int Bits>
__attribute__((target("avx2"))) inline __m256i dot_avx2(const __m256i* lo, const __m256i* hi,
                                                        const int8_t* p) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (Bits != 8) {
    return dot_avx2_chunks(lo, hi, p, 0, 4);
  } else {
    __m256i low = _mm256_setzero_si256(), high = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
      int32_t four;
      std::memcpy(&four, p + 4 * c, 4);
      const __m256i b = _mm256_set1_epi32(four);
      low = _mm256_add_epi32(low, _mm256_madd_epi16(_mm256_maddubs_epi16(lo[c], b), ones));
      high = _mm256_add_epi32(high, _mm256_madd_epi16(_mm256_maddubs_epi16(hi[c], b), ones));
    }
    return _mm256_add_epi32(low, _mm256_slli_epi32(high, 4));
  }
}

// A block's sums for every row (acc[r * 16 + lane]) into y [rows, n] from column first, plus
// the bias where there is one; the last block may hold fewer than 16 outputs.
inline void write_block(const float* acc, int64_t rows, int64_t n, int64_t first,
                        const float* bias, float* y) {
  const int64_t lanes = std::min(kLanes, n - first);
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = y + r * n + first;
    const float* src = acc + r * kLanes;
    if (bias == nullptr) {
      std::memcpy(dst, src, lanes * sizeof(float));
    } else {
      for (int64_t j = 0; j < lanes; ++j) dst[j] = src[j] + bias[first + j];
    }
  }
}

// exp(x) for x <= 0: x = n ln 2 + r, |r| <= ln 2 / 2, exp(r) by its degree-6 Taylor polynomial
// (about 2 ulp), times 2^n. The constants both instruction sets use:
constexpr float kExpFloor = -87.0f, kLog2e = 1.44269504f;
constexpr float kLn2High = 0.693145752f, kLn2Low = 1.42860677e-6f;  // ln 2 in two parts
constexpr float kTaylor[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};

__attribute__((target("avx512f"))) inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpFloor));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), r);
  __m512 p = _mm512_set1_ps(kTaylor[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kTaylor[i]));
  return _mm512_scalef_ps(p, n);
}

__attribute__((target("avx2,fma"))) inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(kExpFloor));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), r);
  __m256 p = _mm256_set1_ps(kTaylor[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kTaylor[i]));
  const __m256i exponent = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

// The sum of 8 floats in a fixed order (attention.cpp, layer.cpp).
__attribute__((target("avx2,fma"))) inline float sum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

}  // namespace quickdraft_simd
