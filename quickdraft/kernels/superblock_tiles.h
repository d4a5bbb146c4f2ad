// The superblock layer's tiles, one per code path: a block of 16 outputs for up to kTile rows,
// each row's integer sums exact in int32 and the same float operations after them on every
// path (superblock.cpp), so a row's bits never depend on the path or the rows beside it.
#pragma once

#include <immintrin.h>

#include "superblock.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace quickdraft_superblock {

// A record's d (which 0) or dmin (1) for its 16 lanes, as float32.
template <int Form, bool Half>
__attribute__((target("avx512f"), always_inline)) inline __m512 factors(const uint8_t* meta,
                                                                         int which) {
  const uint8_t* at = meta + kScaleBytes;
  if constexpr (!Half) return _mm512_loadu_ps(reinterpret_cast<const float*>(at) + 16 * which);
  const int i = Form == kQ6K ? 0 : which;  // the Q6_K form's dmin: -32 d
  const __m512 f =
      _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at) + i));
  return Form == kQ6K && which ? _mm512_mul_ps(f, _mm512_set1_ps(-32.0f)) : f;
}

// The same, 8 lanes: half 0 or 1 of the 16 (AVX2 and F16C).
template <int Form, bool Half>
__attribute__((target("avx2,f16c"), always_inline)) inline __m256 factors8(const uint8_t* meta,
                                                                            int which, int half) {
  const uint8_t* at = meta + kScaleBytes;
  if constexpr (!Half) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(at) + 16 * which + 8 * half);
  }
  const int i = Form == kQ6K ? 0 : which;  // the Q6_K form's dmin: -32 d
  const __m256 f =
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 32 * i + 16 * half)));
  return Form == kQ6K && which ? _mm256_mul_ps(f, _mm256_set1_ps(-32.0f)) : f;
}

// A superblock's integer sums S (one vector a row) to floats, added to out:
// the minimums' sums M in int8 pairs against the activation sums in pairs (4 pairs of groups,
// or for kQ6K a pair of halves for each group: its sub-scales), then
// (d * float(S) + dmin * float(M)) * a, in that order. With ``Half`` the record holds d and dmin
// in float16 (for kQ6K d alone, dmin being -32 d, exact in float32): the same float32 values.
template <int Form, bool Half, int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"), always_inline)) inline void
add_superblock(
    const uint8_t* meta, const Activations& a, int64_t first, int64_t s, int64_t n,
    const __m512i* S, float* out) {
  constexpr int64_t kPairs = Form == kQ6K ? kSuper : kSuper / 2;
  const uint8_t* minimums = Form == kQ6K ? meta : meta + 128;
  const int64_t used = Form == kQ6K ? n : (n + 1) / 2;
  __m512i mn[kPairs];
  for (int64_t pair = 0; pair < kPairs; ++pair) {
    mn[pair] = _mm512_cvtepi8_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(minimums + 32 * pair)));
  }
  const __m512 d = factors<Form, Half>(meta, 0);
  const __m512 dmin = factors<Form, Half>(meta, 1);
  for (int r = 0; r < R; ++r) {
    const int16_t* sums = &a.sums[((first + r) * a.supers + s) * a.per];
    __m512i M = _mm512_setzero_si512();
    for (int64_t pair = 0; pair < used; ++pair) {
      int32_t two;
      std::memcpy(&two, sums + 2 * pair, 4);
      M = _mm512_dpwssd_epi32(M, mn[pair], _mm512_set1_epi32(two));
    }
    const __m512 t = _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(S[r])),
                                   _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(M)));
    float* acc = out + r * kLanes;
    const __m512 scale = _mm512_set1_ps(a.scale[(first + r) * a.supers + s]);
    _mm512_storeu_ps(acc, _mm512_add_ps(_mm512_loadu_ps(acc), _mm512_mul_ps(t, scale)));
  }
}

// One block of 16 outputs for rows [first, first + R), added to out[r * 16 + lane] (zero on
// entry) superblock by superblock. 4-bit codes: chunk c (of 4) holds inputs 8c..8c+3 in its
// low nibbles, 8c+4..8c+7 in its high ones; 8-bit codes: chunk c (of 8) holds inputs 4c..4c+3.
// kQ6K: each group's two halves times their own sub-scales, which are also the minimums'.
template <int Form, bool Half, int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) inline void tile_avx512_vnni(
    const uint8_t* block, const Activations& a, int64_t first, int64_t k, float* out) {
  const int64_t groups = k / kGroup;
  const bool ahead = ahead_pays(R);
  const uint8_t* record = block;
  for (int64_t s = 0; s < a.supers; ++s) {
    const int64_t n = std::min(kSuper, groups - s * kSuper);
    constexpr int64_t kCodeBytes = code_bytes<Form>();
    constexpr int Bits = kBits<Form>;
    const uint8_t* meta = record + n * kCodeBytes;
    __m512i S[R];
    for (int r = 0; r < R; ++r) S[r] = _mm512_setzero_si512();
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* codes = record + j * kCodeBytes;
      if (ahead) prefetch_ahead(codes, kAheadLines<Form>);
      __m512i w[8];
      load_codes<Bits>(codes, w);
      const int8_t* p = a.codes.data() + first * k + (s * kSuper + j) * kGroup;
      if constexpr (Form == kQ6K) {
        // Group j's sub-scales, lane by lane (int8 pairs): the first half's in the low 16 bits.
        const __m512i pairs = _mm512_cvtepi8_epi16(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(meta + 32 * j)));
        const __m512i first_sc = _mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16);
        const __m512i second_sc = _mm512_srai_epi32(pairs, 16);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          __m512i lo, hi;
          dot_avx512_halves(w, p + r * k, lo, hi);
          S[r] = _mm512_add_epi32(S[r], _mm512_add_epi32(_mm512_mullo_epi32(lo, first_sc),
                                                         _mm512_mullo_epi32(hi, second_sc)));
        }
        continue;
      }
      const __m512i sc =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta + 16 * j)));
      // Unrolled, so that the rows' sums stay in registers: as a loop, GCC kept them on the
      // stack, a load and a store a row and group, and 16 rows ran 9% slower (Intel Xeon).
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        // Several rows keep the multipliers busy with one chain a row; one or two rows take
        // two (a chain of 8 dependent products would wait on their latency).
        const __m512i dot =
            R >= 4 ? dot_avx512_chain<Bits>(w, p + r * k) : dot_avx512<Bits>(w, p + r * k);
        S[r] = _mm512_add_epi32(S[r], _mm512_mullo_epi32(dot, sc));
      }
    }
    add_superblock<Form, Half, R>(meta, a, first, s, n, S, out);
    record = meta + kMetaBytes<Form, Half>;
  }
}

// The 256-bit tiles (superblock_tile256.inc), once per instruction set: AVX2's vpmaddubsw, and
// vpdpbusd as AVX-VNNI encodes it (VEX: Intel's client CPUs from the 12th generation) and as
// AVX-512 VNNI does (EVEX, for CPUs with AVX-512 VNNI but not AVX-VNNI, AMD's Zen 4 among them:
// the same tile, testable there).
#define QD_DOT_MADDUBS 1
#define QD_DOT_VNNI 2

// Each namespace's functions are compiled for its instruction set: GCC's target pragma, or
// Clang's attribute pragma (Clang ignores GCC's).
#if defined(__clang__)
#define QD_TARGET_BEGIN(isa) \
  _Pragma(QD_STRINGIFY(clang attribute push(__attribute__((target(isa))), apply_to = function)))
#define QD_TARGET_END _Pragma("clang attribute pop")
#else
#define QD_TARGET_BEGIN(isa) _Pragma("GCC push_options") _Pragma(QD_STRINGIFY(GCC target(isa)))
#define QD_TARGET_END _Pragma("GCC pop_options")
#endif
#define QD_STRINGIFY(x) #x

QD_TARGET_BEGIN("avx2,fma,f16c")
namespace avx2 {
#define QD_DOT QD_DOT_MADDUBS
#include "superblock_tile256.inc"
#undef QD_DOT
}  // namespace avx2
QD_TARGET_END

#if QD_HAS_AVXVNNI
QD_TARGET_BEGIN("avx2,fma,f16c,avxvnni")
namespace avx_vnni {
#define QD_DOT QD_DOT_VNNI
#include "superblock_tile256.inc"
#undef QD_DOT
}  // namespace avx_vnni
QD_TARGET_END
#endif

QD_TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")
namespace avx512_vl_vnni {
#define QD_DOT QD_DOT_VNNI
#define QD_DOT_EVEX
#include "superblock_tile256.inc"
#undef QD_DOT_EVEX
#undef QD_DOT
}  // namespace avx512_vl_vnni
QD_TARGET_END

// A path's tile: up to kRows rows at once (as many as its vector registers hold).
template <int Form, bool Half, int R>
struct Avx512Vnni {
  static constexpr int kRows = kTile;
  static void run(const uint8_t* b, const Activations& a, int64_t first, int64_t k, float* out) {
    tile_avx512_vnni<Form, Half, R>(b, a, first, k, out);
  }
};

template <int Form, bool Half, int R>
struct Avx2 {
  static constexpr int kRows = avx2::kRows;
  static void run(const uint8_t* b, const Activations& a, int64_t first, int64_t k, float* out) {
    avx2::tile<Form, Half, R>(b, a, first, k, out);
  }
};

#if QD_HAS_AVXVNNI
namespace vex_vnni = avx_vnni;
#else
namespace vex_vnni = avx512_vl_vnni;  // never chosen: has_vex_vnni() is false in this build
#endif

template <int Form, bool Half, int R>
struct AvxVnni {
  static constexpr int kRows = vex_vnni::kRows;
  static void run(const uint8_t* b, const Activations& a, int64_t first, int64_t k, float* out) {
    vex_vnni::tile<Form, Half, R>(b, a, first, k, out);
  }
};

template <int Form, bool Half, int R>
struct Avx512VlVnni {
  static constexpr int kRows = avx512_vl_vnni::kRows;
  static void run(const uint8_t* b, const Activations& a, int64_t first, int64_t k, float* out) {
    avx512_vl_vnni::tile<Form, Half, R>(b, a, first, k, out);
  }
};

}  // namespace quickdraft_superblock
