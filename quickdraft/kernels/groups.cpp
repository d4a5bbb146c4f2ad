// Weights in groups of 32, for x86 CPUs: the per-group quantizer every quantized layer starts
// from, and a batch-invariant linear layer on the groups themselves, y = x W^T + b, for layers
// whose activations need a scale per 32 inputs (superblock.cpp shares one per 256).
//
// Weights: per output channel o and group g of 32 input channels, w = s[o,g] * q + m[o,g],
// q in 0..15 (or 0..255), s and m in float16. Activations: per row r and group g,
// x ~= a[r,g] * p with p in -127..127 (a = amax / 127). Then
//
//     y[r,o] = sum_g ( (s[o,g] * dot(q, p)) * a[r,g] + m[o,g] * (a[r,g] * sum(p)) ) + b[o]
//
// where dot and sum are exact int32 (at most 32 * 255 * 127 per group). The float sum runs
// over g in order, the same operations for every row whatever the row count, the row's place
// in the batch, the thread count or the instruction set: each output element is computed by
// one thread, in one fixed sequence of IEEE operations (built with -ffp-contract=off, so no
// multiply-add is fused behind our back). The AVX-512 VNNI path, the AVX2 path and the
// PyTorch reference (quickdraft/kernels/groups.py) give the same bits.
//
// Packed layout (uint8), a record per (block of 16 outputs, group), blocks outer. 4 bits: 4
// chunks of 64 bytes, chunk c holding input channels 8c..8c+7 of the group, byte 4 * lane + t:
// low nibble q[lane][8c + t], high nibble q[lane][8c + 4 + t]. 8 bits: 8 chunks, chunk c
// holding inputs 4c..4c+3, byte 4 * lane + t: q[lane][4c + t]. Then the 16 scales and the 16
// minimums as float16. A chunk is what one VNNI instruction multiplies against 4 broadcast
// activation bytes, 16 outputs at once.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <immintrin.h>

#include "entry.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

namespace {

using namespace quickdraft_simd;

// Row activations, quantized per group of 32: codes, their scale and scale * sum of codes.
struct Activations {
  std::vector<int8_t> codes;  // [rows, k]
  std::vector<float> scale;   // [rows, groups]
  std::vector<float> offset;  // [rows, groups]
};

Activations quantize_rows(const float* x, int64_t rows, int64_t k) {
  const int64_t groups = k / kGroup;
  Activations a{std::vector<int8_t>(rows * k), std::vector<float>(rows * groups),
                std::vector<float>(rows * groups)};
  // Rows in parallel once there is enough of them to pay for waking the threads.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / k);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        // Codes, their scale and scale * sum of codes; a zero group gets all zeros.
        const float* xs = x + r * k + g * kGroup;
        int8_t* codes = a.codes.data() + r * k + g * kGroup;
        const float amax = absmax(xs, kGroup);
        float& scale = a.scale[r * groups + g];
        float& offset = a.offset[r * groups + g];
        if (!(amax > 0.0f)) {
          std::memset(codes, 0, kGroup);
          scale = offset = 0.0f;
          continue;
        }
        const int32_t sum = quantize_group(xs, amax, codes);
        scale = amax / 127.0f;
        offset = scale * static_cast<float>(sum);
      }
    }
  });
  return a;
}

// Rows go through a block in tiles of up to kTile, each row's 16 sums held in a register
// across the groups; the block's weights (15 KB for 1536 inputs) are read again from cache
// for each tile. A row's operations are the same in a tile of any size. 8 rows: 8 sums and a
// group's 8 code vectors fit the registers; against tiles of 4, SmolLM2-135M's 30 layers and
// head took 11% less at 8 rows and 13% less at 16 (four alternating processes).
constexpr int kTile = 8;

// Bytes of one record: the codes (16 lanes x 32 inputs at Bits each), then the float16
// scales and minimums.
template <int Bits>
constexpr int64_t record_bytes() {
  return kLanes * kGroup * Bits / 8 + 2 * kLanes * 2;
}

// One block of 16 outputs for rows [0, R) of `a` from row `first`: out[r * 16 + lane].
// 4-bit codes: chunk c (of 4) holds inputs 8c..8c+3 in its low nibbles, 8c+4..8c+7 in its
// high ones. 8-bit codes: chunk c (of 8) holds inputs 4c..4c+3.
template <int Bits, int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c"))) inline void
tile_avx512_vnni(const uint8_t* records, const Activations& a, int64_t first, int64_t k,
                 float* out) {
  constexpr int64_t kCodeBytes = kLanes * kGroup * Bits / 8;
  const int64_t groups = k / kGroup;
  const int8_t* codes[R];
  const float* scale[R];
  const float* offset[R];
  __m512 acc[R];
  for (int r = 0; r < R; ++r) {
    codes[r] = a.codes.data() + (first + r) * k;
    scale[r] = a.scale.data() + (first + r) * groups;
    offset[r] = a.offset.data() + (first + r) * groups;
    acc[r] = _mm512_setzero_ps();
  }
  const bool ahead = ahead_pays(R);
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* record = records + g * record_bytes<Bits>();
    if (ahead) prefetch_ahead(record, record_bytes<Bits>() / 64);
    __m512i w[8];
    load_codes<Bits>(record, w);
    const __m512 s = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(record + kCodeBytes)));
    const __m512 m = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(record + kCodeBytes + 32)));
    for (int r = 0; r < R; ++r) {
      const __m512 dot = _mm512_cvtepi32_ps(dot_avx512<Bits>(w, codes[r] + g * kGroup));
      const __m512 term = _mm512_mul_ps(_mm512_mul_ps(s, dot), _mm512_set1_ps(scale[r][g]));
      acc[r] = _mm512_add_ps(acc[r], term);
      acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(m, _mm512_set1_ps(offset[r][g])));
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * kLanes, acc[r]);
}

// A group's exact int32 dot products for rows p[0..R) and halves half0 + h, h < H (8 outputs
// each), dot[h * R + r], with AVX2: vpmaddubsw products summed in int16 over the whole group
// (4 bits: 16 products of at most 15 * 127 a lane, 30,480 < 2^15; 8 bits: each nibble's, then
// 16 * high + low), one vpmaddwd to int32 at the end, instead of widening every chunk. Two
// halves in one pass share each row's broadcast activations.
template <int Bits, int R, int H>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void group_dots_avx2(
    const uint8_t* record, int half0, const int8_t* const* p, __m256i* dot) {
  const __m256i low_mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int nibble = 0; nibble < (Bits == 8 ? 2 : 1); ++nibble) {
    __m256i part[H * R];
    for (int i = 0; i < H * R; ++i) part[i] = _mm256_setzero_si256();
    for (int c = 0; c < kAvx2Chunks<Bits>; ++c) {
      __m256i lo[H], hi[H];
      for (int h = 0; h < H; ++h) {
        const __m256i v = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(record + 64 * c + 32 * (half0 + h)));
        lo[h] = _mm256_and_si256(nibble ? _mm256_srli_epi16(v, 4) : v, low_mask);
        hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low_mask);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        int32_t first4, second4 = 0;
        std::memcpy(&first4, p[r] + (Bits == 8 ? 4 : 8) * c, 4);
        if constexpr (Bits != 8) std::memcpy(&second4, p[r] + 8 * c + 4, 4);
        const __m256i first = _mm256_set1_epi32(first4), second = _mm256_set1_epi32(second4);
        for (int h = 0; h < H; ++h) {
          const int i = h * R + r;
          if constexpr (Bits == 8) {
            part[i] = _mm256_add_epi16(part[i], _mm256_maddubs_epi16(lo[h], first));
          } else {
            const __m256i both = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], first),
                                                  _mm256_maddubs_epi16(hi[h], second));
            part[i] = _mm256_add_epi16(part[i], both);
          }
          asm("" : "+x"(part[i]));  // keep the sums in registers, in this order (no spills)
        }
      }
    }
    for (int i = 0; i < H * R; ++i) {
      const __m256i sums = _mm256_madd_epi16(part[i], ones);
      dot[i] = nibble ? _mm256_add_epi32(dot[i], _mm256_slli_epi32(sums, 4)) : sums;
    }
  }
}

// Rows [first, first + R) of a block, R <= 4 (a tile's sums, float accumulators and a group's
// codes in the 16 registers): one row both halves of the block (8 outputs each) in one pass,
// so each record is read once and the memory stream never waits on a second pass; more rows
// a half at a time, the second half's codes from cache. Each output's float sums run in the
// same order either way.
template <int Bits, int R>
__attribute__((target("avx2,fma,f16c"))) inline void rows_avx2(const uint8_t* records,
                                                               const Activations& a,
                                                               int64_t first, int64_t k,
                                                               float* out) {
  constexpr int H = R == 1 ? 2 : 1;  // halves a pass
  constexpr int64_t kCodeBytes = kLanes * kGroup * Bits / 8;
  const int64_t groups = k / kGroup;
  const bool ahead = ahead_pays(R);
  for (int half0 = 0; half0 < 2; half0 += H) {
    __m256 acc[H * R];
    for (int i = 0; i < H * R; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* record = records + g * record_bytes<Bits>();
      if (half0 == 0 && ahead) prefetch_ahead(record, record_bytes<Bits>() / 64);  // 2nd: cache
      const int8_t* p[R];
      for (int r = 0; r < R; ++r) p[r] = a.codes.data() + (first + r) * k + g * kGroup;
      __m256i dot[H * R];
      group_dots_avx2<Bits, R, H>(record, half0, p, dot);
      for (int h = 0; h < H; ++h) {
        const int64_t half = half0 + h;
        const __m256 s = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(record + kCodeBytes + 16 * half)));
        const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(record + kCodeBytes + 32 + 16 * half)));
        for (int r = 0; r < R; ++r) {
          const int64_t row = first + r;
          const int i = h * R + r;
          const __m256 term = _mm256_mul_ps(_mm256_mul_ps(s, _mm256_cvtepi32_ps(dot[i])),
                                            _mm256_set1_ps(a.scale[row * groups + g]));
          acc[i] = _mm256_add_ps(acc[i], term);
          acc[i] = _mm256_add_ps(
              acc[i], _mm256_mul_ps(m, _mm256_set1_ps(a.offset[row * groups + g])));
        }
      }
    }
    for (int h = 0; h < H; ++h) {
      for (int r = 0; r < R; ++r) {
        _mm256_storeu_ps(out + r * kLanes + 8 * (half0 + h), acc[h * R + r]);
      }
    }
  }
}

// The same sums with AVX2: a tile's rows 4 at a time (``rows_avx2``).
template <int Bits, int R>
inline void tile_avx2(const uint8_t* records, const Activations& a, int64_t first, int64_t k,
                      float* out) {
  constexpr int kFirst = R < 4 ? R : 4;
  rows_avx2<Bits, kFirst>(records, a, first, k, out);
  if constexpr (R > 4) tile_avx2<Bits, R - 4>(records, a, first + 4, k, out + 4 * kLanes);
}

template <int Bits, int R>
struct Avx512Vnni {
  static void run(const uint8_t* w, const Activations& a, int64_t first, int64_t k, float* out) {
    tile_avx512_vnni<Bits, R>(w, a, first, k, out);
  }
};

template <int Bits, int R>
struct Avx2 {
  static void run(const uint8_t* w, const Activations& a, int64_t first, int64_t k, float* out) {
    tile_avx2<Bits, R>(w, a, first, k, out);
  }
};

// The last tile, of n < kTile rows.
template <template <int, int> class Tile, int Bits, int R>
inline void dispatch_rest(int64_t n, const uint8_t* records, const Activations& a,
                          int64_t first, int64_t k, float* out) {
  if constexpr (R > 0) {
    if (n == R) return Tile<Bits, R>::run(records, a, first, k, out);
    dispatch_rest<Tile, Bits, R - 1>(n, records, a, first, k, out);
  }
}

// One block of 16 outputs for every row, in tiles: out[r * 16 + lane].
template <template <int, int> class Tile, int Bits>
void run_block(const uint8_t* records, const Activations& a, int64_t rows, int64_t k,
               float* out) {
  int64_t first = 0;
  for (; first + kTile <= rows; first += kTile) {
    Tile<Bits, kTile>::run(records, a, first, k, out + first * kLanes);
  }
  dispatch_rest<Tile, Bits, kTile - 1>(rows - first, records, a, first, k, out + first * kLanes);
}

}  // namespace

namespace quickdraft_kernels {

int64_t group_bytes(int64_t n, int64_t k, int64_t bits) {
  const int64_t record = bits == 4 ? record_bytes<4>() : record_bytes<8>();
  return (n + kLanes - 1) / kLanes * (k / kGroup) * record;
}

void group_product(const float* x, int64_t rows, const uint8_t* packed, int64_t n, int64_t k,
                   const float* bias, int64_t path, int64_t bits, float* y) {
  if (rows == 0) return;
  const int64_t record = bits == 4 ? record_bytes<4>() : record_bytes<8>();
  const int64_t blocks = (n + kLanes - 1) / kLanes, groups = k / kGroup;
  const Activations a = quantize_rows(x, rows, k);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(rows * kLanes);
    for (int64_t block = begin; block < end; ++block) {
      const uint8_t* records = packed + block * groups * record;
      if (path == kAvx512Vnni) {
        (bits == 4 ? run_block<Avx512Vnni, 4> : run_block<Avx512Vnni, 8>)(records, a, rows, k,
                                                                          acc.data());
      } else {
        (bits == 4 ? run_block<Avx2, 4> : run_block<Avx2, 8>)(records, a, rows, k, acc.data());
      }
      write_block(acc.data(), rows, n, block * kLanes, bias, y);
    }
  });
}

}  // namespace quickdraft_kernels

namespace {

at::Tensor group_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, int64_t k,
                     const std::optional<at::Tensor>& bias, int64_t path, int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8, "group_linear: bits must be 4 or 8");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == k, "group_linear: x must be [rows, ", k, "]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "group_linear: x must be contiguous float32 on CPU");
  TORCH_CHECK(k % kGroup == 0, "group_linear: in_features must be a multiple of 32");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.numel() == quickdraft_kernels::group_bytes(n, k, bits),
              "group_linear: packed weights do not match ", n, " x ", k);
  TORCH_CHECK(path != kAuto && supported(path), "group_linear: this CPU cannot run path ", path);
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "group_linear: bias must be [", n, "] float32");
    b = bias->data_ptr<float>();
  }
  at::Tensor out = at::empty({x.size(0), n}, x.options());
  quickdraft_kernels::group_product(x.data_ptr<float>(), x.size(0), packed.data_ptr<uint8_t>(),
                                    n, k, b, path, bits, out.data_ptr<float>());
  return out;
}



// The quantizer of kernels/groups.py (``_quantize_block``), one group of 32 weights: candidate
// grids (the whole range with 0..3 top codes unused, then narrower ranges), each refitted by
// least squares, its scale and minimum rounded to float16, the least squared error kept. An
// exact fit ends the search.
void quantize_weight_group(const float* w, int levels, uint8_t* q, c10::Half* scale,
                    c10::Half* minimum) {
  float low = w[0], high = w[0];
  for (int i = 1; i < kGroup; ++i) {
    low = std::min(low, w[i]);
    high = std::max(high, w[i]);
  }
  const float divisors[] = {float(levels), float(levels - 1), float(levels - 2),
                            float(levels - 3), levels / 0.95f, levels / 0.9f,
                            levels / 0.85f, levels / 0.8f};
  const float margins[] = {0, 0, 0, 0, 0.025f, 0.05f, 0.075f, 0.1f};
  float best = INFINITY;
  uint8_t codes[kGroup];
  for (int c = 0; c < 8 && best > 0; ++c) {
    const float first = std::max((high - low) / divisors[c], 1e-30f);
    float s = first, m = low + (high - low) * margins[c];
    float sq = 0, sqq = 0, sw = 0, swq = 0;
    for (int i = 0; i < kGroup; ++i) {
      const float code = std::min(std::max(std::nearbyint((w[i] - m) / s), 0.0f), float(levels));
      sq += code;
      sqq += code * code;
      sw += w[i];
      swq += w[i] * code;
    }
    const float det = kGroup * sqq - sq * sq;
    if (det > 0) {
      const float fitted = (kGroup * swq - sq * sw) / det;
      if (fitted > 0) {
        s = fitted;
        m = (sw - fitted * sq) / kGroup;
      }
    }
    const c10::Half s16(s), m16(m);
    const float sf = s16, mf = m16;
    float error = 0;
    for (int i = 0; i < kGroup; ++i) {
      float code = 0;
      if (sf > 0) code = std::min(std::max(std::nearbyint((w[i] - mf) / sf), 0.0f), float(levels));
      codes[i] = static_cast<uint8_t>(code);
      const float miss = code * sf + mf - w[i];
      error += miss * miss;
    }
    if (c == 0 || error < best) {
      best = error;
      std::memcpy(q, codes, kGroup);
      *scale = s16;
      *minimum = m16;
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> group_quantize(const at::Tensor& weight,
                                                           int64_t bits) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "group_quantize: weight must be contiguous float32 [out, in]");
  TORCH_CHECK(weight.size(1) % kGroup == 0, "group_quantize: in_features must be a multiple of 32");
  // 6: the superblock layout's codes (its quantizer starts from this search).
  TORCH_CHECK(bits == 4 || bits == 6 || bits == 8, "group_quantize: bits must be 4, 6 or 8");
  const int64_t out = weight.size(0), groups = weight.size(1) / kGroup;
  at::Tensor q = at::empty({out, groups * kGroup}, weight.options().dtype(at::kByte));
  at::Tensor scale = at::empty({out, groups}, weight.options().dtype(at::kHalf));
  at::Tensor minimum = at::empty({out, groups}, weight.options().dtype(at::kHalf));
  const float* w = weight.data_ptr<float>();
  uint8_t* qs = q.data_ptr<uint8_t>();
  c10::Half* ss = scale.data_ptr<c10::Half>();
  c10::Half* ms = minimum.data_ptr<c10::Half>();
  const int levels = (1 << bits) - 1;
  at::parallel_for(0, out * groups, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      quantize_weight_group(w + i * kGroup, levels, qs + i * kGroup, ss + i, ms + i);
    }
  });
  return {q, scale, minimum};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(quickdraft_kernels, m) {
  m.def("group_linear(Tensor x, Tensor packed, int n, int k, Tensor? bias, int path, int bits) "
        "-> Tensor");
  m.def("group_quantize(Tensor weight, int bits) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(quickdraft_kernels, CPU, m) {
  m.impl("group_linear", &group_linear);
  m.impl("group_quantize", &group_quantize);
}
