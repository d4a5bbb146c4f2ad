// A batch-invariant linear layer with 4-bit (or 8-bit) weights in superblocks, for x86 CPUs:
// y = x W^T + b.
//
// Weights: per output channel o, superblock s of 256 input channels (8 groups of 32; the last
// superblock of a row may hold fewer groups) and group j,
//
//     w = d[o,s] * sc[o,s,j] * q + dmin[o,s] * mn[o,s,j]
//
// with q in 0..15 (or 0..63, 0..255), integer sub-scales sc in 0..255 and minimums mn in -127..127,
// and float32 d, dmin: the structure of a GGUF's Q4_K blocks (whose 6-bit scales and minimums
// it holds exactly). Activations: per row and superblock, x ~= a[r,s] * p with p in -127..127,
// and the int16 sums of p per group. Then, exactly in int32,
//
//     S = sum_j sc[j] * dot(q_j, p_j)      (at most 8 * 255 * 32 * 255 * 127 < 2^31)
//     M = sum_j mn[j] * sum(p_j)           (at most 8 * 127 * 32 * 127 < 2^31)
//
// and y[r,o] = sum_s ((d * float(S) + dmin * float(M)) * a[r,s]) + b[o], the float operations
// in that order, the same for every row whatever the row count, its place in the batch, the
// thread count or the instruction set (built with -ffp-contract=off). Against the 32-input
// groups of groups.cpp, a group costs two integer operations a row instead of six float ones, so
// a verify pass of 8-16 rows runs closer to the VNNI peak; activations share a scale over 256
// inputs instead of 32 (what llama.cpp's Q8_K does for its Q4_K products).
//
// Packed layout (uint8): per block of 16 outputs, its superblocks in order; a superblock's
// record is its groups' codes, then sc [8][16] uint8, mn [4 pairs][16 lanes][2] int8 (mn[2p + t]
// of a lane at 32p + 2 lane + t), d [16] and dmin [16] float32. Groups past a short
// superblock's end have sc = mn = 0. A group's codes, chunks of 64 bytes (what one VNNI
// instruction multiplies against 4 broadcast activation bytes, 16 outputs at once): 4 bits, 4
// chunks, chunk c holding inputs 8c..8c+7, byte 4 * lane + t: low nibble q[lane][8c + t], high
// nibble q[lane][8c + 4 + t]; 8 bits, 8 chunks, chunk c holding inputs 4c..4c+3, byte
// 4 * lane + t: q[lane][4c + t]; 6 bits (a GGUF's Q6_K tensors, the head), the low 4 bits as
// the 4-bit chunks, then two 64-byte planes of the high 2 bits: plane P, byte b, bits 2i..2i+1
// belong to the code at byte b of the (4P + i)-th nibble vector (chunk (4P + i) / 2, low
// nibbles for even i).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <immintrin.h>

#include "entry.h"
#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace quickdraft_simd;

constexpr int64_t kSuper = 8;  // groups a superblock
constexpr int64_t kMetaBytes = kSuper * kLanes * 2 + 2 * kLanes * 4;
// The code forms a tile computes: 4, 6 and 8 bits with a sub-scale and minimum per 32 inputs,
// and kQ6K, a GGUF's Q6_K: 6-bit codes with a signed sub-scale per 16 inputs that is also its
// minimum's (w = d * sc * q + dmin * sc, dmin = -32 d).
constexpr int kQ6K = 16;
template <int Form>
constexpr int kBits = Form == kQ6K ? 6 : Form;

// A group's codes in a block of 16 outputs.
template <int Form>
constexpr int64_t code_bytes() {
  return kLanes * kGroup * kBits<Form> / 8;
}

int64_t supers_of(int64_t groups) { return (groups + kSuper - 1) / kSuper; }

// Bytes of one block of 16 outputs over k inputs.
int64_t block_bytes(int64_t k, int64_t bits) {
  const int64_t groups = k / kGroup;
  return groups * kLanes * kGroup * bits / 8 + supers_of(groups) * kMetaBytes;
}

// Row activations, quantized per superblock: codes, the scale, the int16 sums of the codes
// per group of 32 inputs, or per 16 for kQ6K.
struct Activations {
  std::vector<int8_t> codes;  // [rows, k]
  std::vector<float> scale;   // [rows, supers]
  std::vector<int16_t> sums;  // [rows, supers, per], zero past a short superblock
  int64_t supers = 0;
  int64_t per = kSuper;       // sums a superblock: 8, or 16 for kQ6K
};

// One superblock of n groups: codes nearbyint(x * (127 / amax)) (round half to even), as the
// PyTorch reference computes them; sums per group, or per half group with ``halves``.
void quantize_super(const float* xs, int64_t n, int8_t* codes, float* scale, int16_t* sums,
                    bool halves) {
  const float amax = absmax(xs, n * kGroup);
  std::fill(sums, sums + (halves ? 2 : 1) * kSuper, int16_t{0});
  if (!(amax > 0.0f)) {
    std::memset(codes, 0, n * kGroup);
    *scale = 0.0f;
    return;
  }
  *scale = amax / 127.0f;
  for (int64_t j = 0; j < n; ++j) {
    int8_t* group = codes + j * kGroup;
    const int32_t total = quantize_group(xs + j * kGroup, amax, group);
    if (!halves) {
      sums[j] = static_cast<int16_t>(total);
      continue;
    }
    int32_t first = 0;
    for (int64_t i = 0; i < kGroup / 2; ++i) first += group[i];
    sums[2 * j] = static_cast<int16_t>(first);
    sums[2 * j + 1] = static_cast<int16_t>(total - first);
  }
}

Activations quantize_rows(const float* x, int64_t rows, int64_t k, bool halves) {
  const int64_t groups = k / kGroup, supers = supers_of(groups);
  const int64_t per = halves ? 2 * kSuper : kSuper;
  Activations a{std::vector<int8_t>(rows * k), std::vector<float>(rows * supers),
                std::vector<int16_t>(rows * supers * per), supers, per};
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / k);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t s = 0; s < supers; ++s) {
        const int64_t n = std::min(kSuper, groups - s * kSuper);
        const int64_t at = r * k + s * kSuper * kGroup;
        quantize_super(x + at, n, a.codes.data() + at, &a.scale[r * supers + s],
                       &a.sums[(r * supers + s) * per], halves);
      }
    }
  });
  return a;
}

// Rows of a block go in tiles of up to kTile, their integer sums in registers; the block's
// records are read again (from cache) for each tile. 16 rows: 16 sums, a group's 8 code
// vectors and its sub-scales fill 25 of the 32 vector registers, and a 16-row verify unpacks
// each group's codes once.
constexpr int kTile = 16;
// From this many rows a tile prefetches the next block: it computes long enough per group for
// the lines to arrive, and the hardware prefetcher alone left 16-row passes 10% slower. A row
// or two stream at the memory rate without it.
constexpr int64_t kPrefetchRows = 4;

// One block of 16 outputs for rows [first, first + R), added to out[r * 16 + lane] (zero on
// entry) superblock by superblock. 4-bit codes: chunk c (of 4) holds inputs 8c..8c+3 in its
// low nibbles, 8c+4..8c+7 in its high ones; 8-bit codes: chunk c (of 8) holds inputs 4c..4c+3.
// kQ6K: each group's two halves times their own sub-scales, which are also the minimums'.
template <int Form, int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) inline void tile_avx512_vnni(
    const uint8_t* block, const Activations& a, int64_t first, int64_t k, float* out,
    const uint8_t* next) {
  const int64_t groups = k / kGroup;
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
      if (next != nullptr) {  // the next block's group, into L1 while this one computes
        const char* ahead = reinterpret_cast<const char*>(next + (codes - block));
        for (int line = 0; line < kCodeBytes / 64; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
      }
      __m512i w[8];
      load_codes<Bits>(codes, w);
      const int8_t* p = a.codes.data() + first * k + (s * kSuper + j) * kGroup;
      if constexpr (Form == kQ6K) {
        // Group j's sub-scales, lane by lane (int8 pairs): the first half's in the low 16 bits.
        const __m512i pairs = _mm512_cvtepi8_epi16(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(meta + 32 * j)));
        const __m512i first_sc = _mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16);
        const __m512i second_sc = _mm512_srai_epi32(pairs, 16);
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
      for (int r = 0; r < R; ++r) {
        // Several rows keep the multipliers busy with one chain a row; one or two rows take
        // two (a chain of 8 dependent products would wait on their latency).
        const __m512i dot =
            R >= 4 ? dot_avx512_chain<Bits>(w, p + r * k) : dot_avx512<Bits>(w, p + r * k);
        S[r] = _mm512_add_epi32(S[r], _mm512_mullo_epi32(dot, sc));
      }
    }
    // Minimums in int8 pairs, against the activation sums in pairs: 4 pairs of groups, or
    // for kQ6K a pair of halves for each group (its sub-scales).
    constexpr int64_t kPairs = Form == kQ6K ? kSuper : kSuper / 2;
    const uint8_t* minimums = Form == kQ6K ? meta : meta + 128;
    const int64_t used = Form == kQ6K ? n : (n + 1) / 2;
    __m512i mn[kPairs];
    for (int64_t pair = 0; pair < kPairs; ++pair) {
      mn[pair] = _mm512_cvtepi8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(minimums + 32 * pair)));
    }
    const __m512 d = _mm512_loadu_ps(reinterpret_cast<const float*>(meta + 256));
    const __m512 dmin = _mm512_loadu_ps(reinterpret_cast<const float*>(meta + 320));
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
      _mm512_storeu_ps(acc, _mm512_add_ps(_mm512_loadu_ps(acc),
                                          _mm512_mul_ps(t, _mm512_set1_ps(a.scale[(first + r) * a.supers + s]))));
    }
    record = meta + kMetaBytes;
  }
}

// The same sums with AVX2, 8 outputs (half a block) at a time (``dot_avx2``).
template <int Form, int R>
__attribute__((target("avx2,fma,f16c"))) inline void tile_avx2(const uint8_t* block,
                                                               const Activations& a,
                                                               int64_t first, int64_t k,
                                                               float* out) {
  const int64_t groups = k / kGroup;
  for (int half = 0; half < 2; ++half) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const uint8_t* record = block;
    for (int64_t s = 0; s < a.supers; ++s) {
      const int64_t n = std::min(kSuper, groups - s * kSuper);
      constexpr int64_t kCodeBytes = code_bytes<Form>();
      constexpr int Bits = kBits<Form>;
      const uint8_t* meta = record + n * kCodeBytes;
      __m256i S[R], M[R];
      for (int r = 0; r < R; ++r) S[r] = M[r] = _mm256_setzero_si256();
      for (int64_t j = 0; j < n; ++j) {
        const uint8_t* codes = record + j * kCodeBytes;
        __m256i lo[kAvx2Chunks<Bits>], hi[kAvx2Chunks<Bits>];
        load_codes_avx2<Bits>(codes, half, lo, hi);
        if constexpr (Form == kQ6K) {  // as the AVX-512 tile: the halves' own sub-scales
          const __m256i pairs = _mm256_cvtepi8_epi16(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(meta + 32 * j + 16 * half)));
          const __m256i first_sc = _mm256_srai_epi32(_mm256_slli_epi32(pairs, 16), 16);
          const __m256i second_sc = _mm256_srai_epi32(pairs, 16);
          for (int r = 0; r < R; ++r) {
            const int8_t* p = a.codes.data() + (first + r) * k + (s * kSuper + j) * kGroup;
            const __m256i both =
                _mm256_add_epi32(_mm256_mullo_epi32(dot_avx2_chunks(lo, hi, p, 0, 2), first_sc),
                                 _mm256_mullo_epi32(dot_avx2_chunks(lo, hi, p, 2, 4), second_sc));
            S[r] = _mm256_add_epi32(S[r], both);
          }
          continue;
        }
        const __m256i sc = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(meta + 16 * j + 8 * half)));
        for (int r = 0; r < R; ++r) {
          const int8_t* p = a.codes.data() + (first + r) * k + (s * kSuper + j) * kGroup;
          const __m256i d = dot_avx2<Bits>(lo, hi, p);
          S[r] = _mm256_add_epi32(S[r], _mm256_mullo_epi32(d, sc));
        }
      }
      const uint8_t* minimums = Form == kQ6K ? meta : meta + 128;
      const int64_t used = Form == kQ6K ? n : (n + 1) / 2;
      for (int64_t pair = 0; pair < used; ++pair) {
        const __m256i mn = _mm256_cvtepi8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(minimums + 32 * pair + 16 * half)));
        for (int r = 0; r < R; ++r) {
          int32_t sums;
          std::memcpy(&sums, &a.sums[((first + r) * a.supers + s) * a.per + 2 * pair], 4);
          M[r] = _mm256_add_epi32(M[r], _mm256_madd_epi16(mn, _mm256_set1_epi32(sums)));
        }
      }
      const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(meta + 256) + 8 * half);
      const __m256 dmin = _mm256_loadu_ps(reinterpret_cast<const float*>(meta + 320) + 8 * half);
      for (int r = 0; r < R; ++r) {
        const __m256 t = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(S[r])),
                                       _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(M[r])));
        acc[r] = _mm256_add_ps(
            acc[r], _mm256_mul_ps(t, _mm256_set1_ps(a.scale[(first + r) * a.supers + s])));
      }
      record = meta + kMetaBytes;
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * kLanes + 8 * half, acc[r]);
  }
}

// A path's tile: up to kRows rows at once (as many as its vector registers hold).
template <int Bits, int R>
struct Avx512Vnni {
  static constexpr int kRows = kTile;
  static void run(const uint8_t* b, const Activations& a, int64_t first, int64_t k, float* out,
                  const uint8_t* next) {
    tile_avx512_vnni<Bits, R>(b, a, first, k, out, next);
  }
};

template <int Bits, int R>
struct Avx2 {
  static constexpr int kRows = 8;  // 16 registers of 256 bits
  static void run(const uint8_t* b, const Activations& a, int64_t first, int64_t k, float* out,
                  const uint8_t*) {
    tile_avx2<Bits, R>(b, a, first, k, out);
  }
};

// The last tile, of n < kRows rows.
template <template <int, int> class Tile, int Bits, int R>
inline void dispatch_rest(int64_t n, const uint8_t* block, const Activations& a, int64_t first,
                          int64_t k, float* out, const uint8_t* next) {
  if constexpr (R > 0) {
    if (n == R) return Tile<Bits, R>::run(block, a, first, k, out, next);
    dispatch_rest<Tile, Bits, R - 1>(n, block, a, first, k, out, next);
  }
}

// One block of 16 outputs for every row, in whole tiles and one tile of the rest.
template <template <int, int> class Tile, int Bits>
void run_block(const uint8_t* block, const Activations& a, int64_t rows, int64_t k, float* out,
               const uint8_t* next) {
  constexpr int kRows = Tile<Bits, 1>::kRows;
  std::fill(out, out + rows * kLanes, 0.0f);
  int64_t first = 0;
  for (; first + kRows <= rows; first += kRows) {
    Tile<Bits, kRows>::run(block, a, first, k, out + first * kLanes, first == 0 ? next : nullptr);
  }
  float* rest = out + first * kLanes;
  dispatch_rest<Tile, Bits, kRows - 1>(rows - first, block, a, first, k, rest,
                                       first == 0 ? next : nullptr);
}

// The fastest path this CPU runs (0: none, use the PyTorch reference).
int64_t best_path() {
  if (supported(kAvx512Vnni)) return kAvx512Vnni;
  if (supported(kAvx2)) return kAvx2;
  return kAuto;
}

bool path_supported(int64_t path) { return supported(path); }

}  // namespace

namespace quickdraft_kernels {

int64_t superblock_bytes(int64_t n, int64_t k, int64_t bits) {
  return (n + kLanes - 1) / kLanes * block_bytes(k, bits);
}

void superblock_product(const float* x, int64_t rows, const uint8_t* packed, int64_t n,
                        int64_t k, const float* bias, int64_t path, int64_t bits, int64_t sub,
                        float* y) {
  if (rows == 0) return;
  const int64_t blocks = (n + kLanes - 1) / kLanes, stride = block_bytes(k, bits);
  const bool q6k = sub == 16;
  const Activations a = quantize_rows(x, rows, k, q6k);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(rows * kLanes);
    for (int64_t block = begin; block < end; ++block) {
      const uint8_t* records = packed + block * stride;
      const uint8_t* next = block + 1 < end && rows >= kPrefetchRows ? records + stride : nullptr;
      const auto run = path == kAvx512Vnni
                           ? (q6k         ? run_block<Avx512Vnni, kQ6K>
                              : bits == 4 ? run_block<Avx512Vnni, 4>
                              : bits == 6 ? run_block<Avx512Vnni, 6>
                                          : run_block<Avx512Vnni, 8>)
                           : (q6k         ? run_block<Avx2, kQ6K>
                              : bits == 4 ? run_block<Avx2, 4>
                              : bits == 6 ? run_block<Avx2, 6>
                                          : run_block<Avx2, 8>);
      run(records, a, rows, k, acc.data(), next);
      write_block(acc.data(), rows, n, block * kLanes, bias, y);
    }
  });
}

}  // namespace quickdraft_kernels

namespace {

at::Tensor superblock_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, int64_t k,
                             const std::optional<at::Tensor>& bias, int64_t path,
                             int64_t bits, int64_t sub) {
  TORCH_CHECK(bits == 4 || bits == 6 || bits == 8, "superblock_linear: bits must be 4, 6 or 8");
  TORCH_CHECK(sub == 32 || (sub == 16 && bits == 6),
              "superblock_linear: sub-blocks of 32 inputs, or of 16 with 6 bits");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == k, "superblock_linear: x must be [rows, ", k, "]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "superblock_linear: x must be contiguous float32 on CPU");
  TORCH_CHECK(k % kGroup == 0, "superblock_linear: in_features must be a multiple of 32");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.numel() == quickdraft_kernels::superblock_bytes(n, k, bits),
              "superblock_linear: packed weights do not match ", n, " x ", k);
  TORCH_CHECK(path != kAuto && supported(path), "superblock_linear: this CPU cannot run path ",
              path);
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "superblock_linear: bias must be [", n, "] float32");
    b = bias->data_ptr<float>();
  }
  at::Tensor out = at::empty({x.size(0), n}, x.options());
  quickdraft_kernels::superblock_product(x.data_ptr<float>(), x.size(0),
                                         packed.data_ptr<uint8_t>(), n, k, b, path, bits, sub,
                                         out.data_ptr<float>());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(quickdraft_kernels, m) {
  m.def("superblock_linear(Tensor x, Tensor packed, int n, int k, Tensor? bias, int path, "
        "int bits, int sub=32) "
        "-> Tensor");
  m.def("supported(int path) -> bool", &path_supported);
  m.def("best_path() -> int", &best_path);
}

TORCH_LIBRARY_IMPL(quickdraft_kernels, CPU, m) {
  m.impl("superblock_linear", &superblock_linear);
}
