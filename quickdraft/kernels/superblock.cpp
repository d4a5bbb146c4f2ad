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
// of a lane at 32p + 2 lane + t), d [16] and dmin [16] float32; or, in a "half" record, d and
// dmin in float16 (a Q6_K-form record d alone, its dmin being -32 d): the packer writes one
// where every factor is a float16 (a GGUF's are), so it holds the same values in fewer bytes
// and no bit of a result changes. Groups past a short superblock's end have sc = mn = 0. A
// group's codes, chunks of 64 bytes (what one VNNI instruction multiplies against 4 broadcast
// activation bytes, 16 outputs at once): 4 bits, 4 chunks, chunk c holding inputs 8c..8c+7,
// byte 4 * lane + t: low nibble q[lane][8c + t], high nibble q[lane][8c + 4 + t]; 8 bits, 8
// chunks, chunk c holding inputs 4c..4c+3, byte 4 * lane + t: q[lane][4c + t]; 6 bits (a GGUF's
// Q6_K tensors, the head), the low 4 bits as the 4-bit chunks, then two 64-byte planes of the
// high 2 bits: plane P, byte b, bits 2i..2i+1 belong to the code at byte b of the (4P + i)-th
// nibble vector (chunk (4P + i) / 2, low nibbles for even i).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <immintrin.h>

#include "entry.h"
#include "superblock_tiles.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace quickdraft_superblock;

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

// The last tile, of n < kRows rows.
template <template <int, bool, int> class Tile, int Form, bool Half, int R>
inline void dispatch_rest(int64_t n, const uint8_t* block, const Activations& a, int64_t first,
                          int64_t k, float* out) {
  if constexpr (R > 0) {
    if (n == R) return Tile<Form, Half, R>::run(block, a, first, k, out);
    dispatch_rest<Tile, Form, Half, R - 1>(n, block, a, first, k, out);
  }
}

// One block of 16 outputs for every row, in whole tiles and one tile of the rest.
template <template <int, bool, int> class Tile, int Form, bool Half>
void run_block(const uint8_t* block, const Activations& a, int64_t rows, int64_t k, float* out) {
  constexpr int kRows = Tile<Form, Half, 1>::kRows;
  std::fill(out, out + rows * kLanes, 0.0f);
  int64_t first = 0;
  for (; first + kRows <= rows; first += kRows) {
    Tile<Form, Half, kRows>::run(block, a, first, k, out + first * kLanes);
  }
  float* rest = out + first * kLanes;
  dispatch_rest<Tile, Form, Half, kRows - 1>(rows - first, block, a, first, k, rest);
}

using BlockRun = void (*)(const uint8_t*, const Activations&, int64_t, int64_t, float*);

// The block function of a path and form.
template <template <int, bool, int> class Tile, bool Half>
BlockRun block_run(bool q6k, int64_t bits) {
  return q6k         ? run_block<Tile, kQ6K, Half>
         : bits == 4 ? run_block<Tile, 4, Half>
         : bits == 6 ? run_block<Tile, 6, Half>
                     : run_block<Tile, 8, Half>;
}

template <template <int, bool, int> class Tile>
BlockRun block_run(bool half, bool q6k, int64_t bits) {
  return half ? block_run<Tile, true>(q6k, bits) : block_run<Tile, false>(q6k, bits);
}

// The block function of a path (one this CPU runs) and form.
BlockRun block_run_of(int64_t path, bool half, bool q6k, int64_t bits) {
  switch (path) {
    case kAvx512Vnni:
      return block_run<Avx512Vnni>(half, q6k, bits);
    case kAvxVnni:
      return has_vex_vnni() ? block_run<AvxVnni>(half, q6k, bits)
                            : block_run<Avx512VlVnni>(half, q6k, bits);
    default:
      return block_run<Avx2>(half, q6k, bits);
  }
}

// The fastest path this CPU runs (0: none, use the PyTorch reference).
int64_t best_path() {
  if (supported(kAvx512Vnni)) return kAvx512Vnni;
  if (has_vex_vnni() && supported(kAvxVnni)) return kAvxVnni;
  if (supported(kAvx2)) return kAvx2;
  return kAuto;
}

bool path_supported(int64_t path) { return supported(path); }

}  // namespace

namespace quickdraft_kernels {

int64_t superblock_bytes(int64_t n, int64_t k, int64_t bits, int64_t sub, bool half) {
  return (n + kLanes - 1) / kLanes * block_bytes(k, bits, sub == 16, half);
}

void superblock_product(const float* x, int64_t rows, const uint8_t* packed, int64_t n,
                        int64_t k, const float* bias, int64_t path, int64_t bits, int64_t sub,
                        bool half, float* y) {
  if (rows == 0) return;
  const bool q6k = sub == 16;
  const int64_t blocks = (n + kLanes - 1) / kLanes, stride = block_bytes(k, bits, q6k, half);
  const Activations a = quantize_rows(x, rows, k, q6k);
  const BlockRun run = block_run_of(path, half, q6k, bits);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(rows * kLanes);
    for (int64_t block = begin; block < end; ++block) {
      const uint8_t* records = packed + block * stride;
      run(records, a, rows, k, acc.data());
      write_block(acc.data(), rows, n, block * kLanes, bias, y);
    }
  });
}

}  // namespace quickdraft_kernels

namespace {

at::Tensor superblock_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, int64_t k,
                             const std::optional<at::Tensor>& bias, int64_t path,
                             int64_t bits, int64_t sub, bool half) {
  TORCH_CHECK(bits == 4 || bits == 6 || bits == 8, "superblock_linear: bits must be 4, 6 or 8");
  TORCH_CHECK(sub == 32 || (sub == 16 && bits == 6),
              "superblock_linear: sub-blocks of 32 inputs, or of 16 with 6 bits");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == k, "superblock_linear: x must be [rows, ", k, "]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "superblock_linear: x must be contiguous float32 on CPU");
  TORCH_CHECK(k % kGroup == 0, "superblock_linear: in_features must be a multiple of 32");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.numel() == quickdraft_kernels::superblock_bytes(n, k, bits, sub, half),
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
                                         half, out.data_ptr<float>());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(quickdraft_kernels, m) {
  m.def("superblock_linear(Tensor x, Tensor packed, int n, int k, Tensor? bias, int path, "
        "int bits, int sub=32, bool half=False) "
        "-> Tensor");
  m.def("supported(int path) -> bool", &path_supported);
  m.def("best_path() -> int", &best_path);
}

TORCH_LIBRARY_IMPL(quickdraft_kernels, CPU, m) {
  m.impl("superblock_linear", &superblock_linear);
}
