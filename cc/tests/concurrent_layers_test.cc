// The layer-concurrency core: the GEMM matches its in-order reference bit for
// bit, the CPU lane pool keeps its contract (Note [Lane pool]), and the
// convolution and matmul kernels are right (against plain loops and the
// adjoint identity) and bitwise identical for every number of lanes.
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "cc/core/conv.h"
#include "cc/core/gemm.h"
#include "cc/core/lane_pool.h"
#include "cc/core/matmul.h"
#include "cc/core/work_plan.h"
#include "cc/tests/test_main.h"

namespace tf_glp::core {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

double Dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

TEST(GemmMatchesInOrderReferenceBitForBit) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t m = 1 + gen() % 140, n = 1 + gen() % 70, k = 1 + gen() % 600;
    GemmArgs g;
    g.transpose_a = gen() % 2;
    g.transpose_b = gen() % 2;
    g.accumulate = gen() % 2;
    g.m = m, g.n = n, g.k = k;
    g.lda = (g.transpose_a ? m : k) + gen() % 3;
    g.ldb = (g.transpose_b ? k : n) + gen() % 3;
    g.ldc = n + gen() % 3;
    std::vector<float> a = Random((g.transpose_a ? k : m) * g.lda, trial);
    std::vector<float> b = Random((g.transpose_b ? n : k) * g.ldb, trial + 100);
    std::vector<float> c = Random(m * g.ldc, trial + 200), expected = c;
    g.a = a.data(), g.b = b.data(), g.c = c.data();
    Gemm(g);
    g.c = expected.data();
    ReferenceGemm(g, GemmUsesFma());
    EXPECT_TRUE(SameBits(c, expected));
  }
}

TEST(GemmWithZeroDepthZeroesOrKeeps) {
  std::vector<float> c(6, 5.0f);
  GemmArgs g;
  g.m = 2, g.n = 3, g.k = 0, g.ldc = 3, g.c = c.data();
  g.accumulate = true;
  Gemm(g);
  EXPECT_EQ(c[4], 5.0f);
  g.accumulate = false;
  Gemm(g);
  EXPECT_EQ(c[4], 0.0f);
}

TEST(LaneCountIsChecked) {
  EXPECT_TRUE(CheckLaneCount(1).empty());
  EXPECT_TRUE(CheckLaneCount(kMaxLanes).empty());
  EXPECT_TRUE(CheckLaneCount(0).find("got 0") != std::string::npos);
  EXPECT_TRUE(CheckLaneCount(kMaxLanes + 1).find(std::to_string(kMaxLanes + 1)) != std::string::npos);
}

TEST(LanePoolRunsEveryItemOnceOnValidLanes) {
  CpuLanePool pool(3);
  for (int64_t lanes : {1, 2, 3, 8, 64}) {
    for (int64_t items : {0, 1, 5, 300}) {
      std::vector<std::atomic<int>> hits(items);
      std::atomic<bool> bad_lane{false};
      pool.Run(lanes, items, [&](int lane, int64_t item) {
        if (lane < 0 || lane >= lanes) bad_lane = true;
        hits[item].fetch_add(1);
      });
      EXPECT_TRUE(!bad_lane.load());
      for (int64_t i = 0; i < items; ++i) EXPECT_EQ(hits[i].load(), 1);
    }
  }
}

TEST(LanePoolReusesThreadsAndKeepsALaneOnOneThreadAtATime) {
  CpuLanePool pool(2);
  std::mutex mutex;
  std::set<std::thread::id> threads;
  for (int call = 0; call < 100; ++call) {
    std::vector<std::atomic<int>> busy(8);
    std::atomic<bool> overlap{false};
    pool.Run(8, 64, [&](int lane, int64_t) {
      if (busy[lane].fetch_add(1) != 0) overlap = true;
      {
        std::lock_guard<std::mutex> lock(mutex);
        threads.insert(std::this_thread::get_id());
      }
      busy[lane].fetch_sub(1);
    });
    EXPECT_TRUE(!overlap.load());
  }
  // More lanes (8) than threads (2): still only the pool's two threads.
  EXPECT_TRUE(threads.size() <= 2);
}

TEST(LanePoolRethrowsAndStaysUsable) {
  CpuLanePool pool(2);
  bool thrown = false;
  try {
    pool.Run(4, 100, [](int, int64_t item) {
      if (item == 17) throw std::runtime_error("item 17");
    });
  } catch (const std::runtime_error& e) {
    thrown = std::string(e.what()) == "item 17";
  }
  EXPECT_TRUE(thrown);
  std::atomic<int> count{0};
  pool.Run(4, 10, [&](int, int64_t) { count++; });
  EXPECT_EQ(count.load(), 10);
}

TEST(ConvShapeFollowsTensorFlow) {
  Conv2DShape s;
  s.batch = 1, s.in_h = 7, s.in_w = 8, s.in_c = 1, s.filter_h = 3, s.filter_w = 2,
  s.out_c = 1, s.stride_h = 2, s.stride_w = 3;
  EXPECT_TRUE(MakeConv2DShape(true, &s).empty());
  EXPECT_EQ(s.out_h, 4);  // ceil(7 / 2)
  EXPECT_EQ(s.out_w, 3);  // ceil(8 / 3)
  EXPECT_EQ(s.pad_top, 1);  // pad 2: 1 above, 1 below
  EXPECT_EQ(s.pad_left, 0);  // pad 1: 0 left, 1 right
  EXPECT_TRUE(MakeConv2DShape(false, &s).empty());
  EXPECT_EQ(s.out_h, 3);
  EXPECT_EQ(s.out_w, 3);
  s.dilation_h = 4;  // span 9 > 7
  EXPECT_TRUE(MakeConv2DShape(false, &s).find("fit") != std::string::npos);
  s.in_c = 0;
  EXPECT_TRUE(MakeConv2DShape(true, &s).find("input channels") != std::string::npos);
}

// Note [Checked sizes]: sizes whose products or spans overflow int64 are an
// error naming the overflow, never a wrapped (negative) size.
TEST(ConvShapeRefusesSizesThatOverflow) {
  const int64_t kInt32Max = 2147483647;
  const auto make = [](int64_t in_h, int64_t in_w, int64_t filter_h, int64_t dilation_h, int64_t out_c, bool same) {
    Conv2DShape s;
    s.batch = 2, s.in_h = in_h, s.in_w = in_w, s.in_c = 1, s.filter_h = filter_h, s.filter_w = 1;
    s.out_c = out_c, s.dilation_h = dilation_h;
    return std::make_pair(MakeConv2DShape(same, &s), s);
  };
  // The fuzzer's abort: input_sizes [2, 2^31 - 1, 2^31 - 1, 1], 2 filters:
  // 2^63 output elements.
  auto [error, shape] = make(kInt32Max, kInt32Max, 1, 1, 2, true);
  EXPECT_TRUE(error.find("output size overflows") != std::string::npos);
  // A dilated span that overflows int64.
  std::tie(error, shape) = make(5, 5, int64_t{1} << 40, int64_t{1} << 30, 1, true);
  EXPECT_TRUE(error.find("dilated filter height overflows") != std::string::npos);
  // The largest dilation TensorFlow's attribute holds, SAME: a valid shape
  // with out = in and a huge padding, all of it representable.
  std::tie(error, shape) = make(4, 3, 2, kInt32Max, 1, true);
  EXPECT_TRUE(error.empty());
  EXPECT_EQ(shape.out_h, 4);
  EXPECT_EQ(shape.pad_top, (kInt32Max + 1 + 3 - 4) / 2);  // span 2^31, reach 3, input 4
  // ... and VALID refuses it (the filter does not fit).
  std::tie(error, shape) = make(4, 3, 2, kInt32Max, 1, false);
  EXPECT_TRUE(error.find("fit") != std::string::npos);
}

void CheckConv(Conv2DShape s, bool same, uint32_t seed) {
  EXPECT_TRUE(MakeConv2DShape(same, &s).empty());
  const CpuLanePool& pool = CpuLanePool::Global();
  auto x = Random(s.batch * s.InputSampleElements(), seed);
  auto w = Random(s.FilterElements(), seed + 1);
  auto dy = Random(s.batch * s.OutputSampleElements(), seed + 2);
  std::vector<float> reference(dy.size());
  ReferenceConv2D(s, x.data(), w.data(), reference.data());
  std::vector<float> y1, dx1, dw1;
  for (int64_t lanes : {1, 2, 3, 8}) {
    std::vector<float> y(dy.size()), dx(x.size()), dw(w.size());
    std::vector<float> ws(std::max({Conv2DForwardWorkspace(s, lanes),
                                    Conv2DBackpropInputWorkspace(s, lanes),
                                    Conv2DBackpropFilterWorkspace(s, lanes), int64_t{1}}));
    Conv2DForward(s, x.data(), w.data(), y.data(), lanes, ws.data(), pool);
    Conv2DBackpropInput(s, w.data(), dy.data(), dx.data(), lanes, ws.data(), pool);
    Conv2DBackpropFilter(s, x.data(), dy.data(), dw.data(), lanes, ws.data(), pool);
    if (lanes == 1) {
      for (size_t i = 0; i < y.size(); ++i) {
        EXPECT_TRUE(std::fabs(y[i] - reference[i]) <= 1e-4f * (1.0f + std::fabs(reference[i])));
      }
      // Adjoint identity: <conv(x, w), dy> = <x, dx> = <w, dw>.
      const double forward = Dot(reference, dy);
      EXPECT_TRUE(std::fabs(forward - Dot(x, dx)) <= 1e-3 * (1.0 + std::fabs(forward)));
      EXPECT_TRUE(std::fabs(forward - Dot(w, dw)) <= 1e-3 * (1.0 + std::fabs(forward)));
      y1 = y, dx1 = dx, dw1 = dw;
    } else {
      EXPECT_TRUE(SameBits(y, y1));
      EXPECT_TRUE(SameBits(dx, dx1));
      EXPECT_TRUE(SameBits(dw, dw1));
    }
  }
}

TEST(ConvIsRightAndBitwiseTheSameForEveryLaneCount) {
  Conv2DShape s;
  s.batch = 5, s.in_h = 9, s.in_w = 8, s.in_c = 3, s.filter_h = 3, s.filter_w = 3, s.out_c = 7;
  CheckConv(s, true, 1);
  CheckConv(s, false, 2);
  s.stride_h = 2, s.dilation_w = 2;
  CheckConv(s, true, 3);
  CheckConv(s, false, 4);
  s.filter_h = 1, s.filter_w = 1, s.stride_h = 1, s.dilation_w = 1;  // pointwise
  CheckConv(s, true, 5);
  s.batch = 40, s.filter_h = 2, s.filter_w = 5, s.stride_w = 3;  // more samples than groups
  CheckConv(s, true, 6);
}

TEST(WorkPlanTilesCoverEveryElementOnceWhateverTheLanes) {
  for (auto [rows, columns] : {std::pair<int64_t, int64_t>{1, 1}, {128, 256}, {129, 257}, {1000, 70}, {5, 3000}}) {
    std::vector<int> hits(rows * columns, 0);
    const int64_t tiles = NumTiles(rows, columns);
    EXPECT_EQ(tiles, CeilDiv(rows, kTileRows) * CeilDiv(columns, kTileColumns));
    for (int64_t i = 0; i < tiles; ++i) {
      const Tile t = TileAt(rows, columns, i);
      EXPECT_TRUE(t.rows() >= 1 && t.rows() <= kTileRows && t.columns() >= 1 && t.columns() <= kTileColumns);
      for (int64_t r = t.row_begin; r < t.row_end; ++r) {
        for (int64_t c = t.column_begin; c < t.column_end; ++c) ++hits[r * columns + c];
      }
    }
    for (int h : hits) EXPECT_EQ(h, 1);
  }
  EXPECT_EQ(NumTiles(0, 5), 0);
  EXPECT_EQ(NumTiles(5, 0), 0);
  EXPECT_EQ(LanesUsed(8, 3), 3);
  EXPECT_EQ(LanesUsed(2, 0), 1);
  EXPECT_EQ(LanesUsed(1000, 1000), kMaxLanes);
}

TEST(MatMulIsRightAndBitwiseTheSameForEveryLaneCount) {
  const CpuLanePool& pool = CpuLanePool::Global();
  // The last two shapes have several tiles in both directions (Note [Work plan]).
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 3, 2}, {37, 50, 11}, {300, 64, 10},
                         {260, 33, 600}, {129, 300, 257}}) {
    auto a = Random(m * k, m), w = Random(k * n, k), dy = Random(m * n, n);
    std::vector<float> y1, dx1, dw1;
    for (int64_t lanes : {1, 2, 4, 7}) {
      std::vector<float> y(m * n), dx(m * k), dw(k * n);
      ConcurrentMatMul(m, n, k, a.data(), w.data(), false, y.data(), lanes, pool);
      ConcurrentMatMul(m, k, n, dy.data(), w.data(), true, dx.data(), lanes, pool);
      MatMulGradWeights(m, k, n, a.data(), dy.data(), dw.data(), lanes, pool);
      if (lanes == 1) {
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p) s += double(a[i * k + p]) * w[p * n + j];
            EXPECT_TRUE(std::fabs(y[i * n + j] - s) <= 1e-4 * (1 + std::fabs(s)));
          }
        }
        const double forward = Dot(y, dy);
        EXPECT_TRUE(std::fabs(forward - Dot(a, dx)) <= 1e-3 * (1 + std::fabs(forward)));
        EXPECT_TRUE(std::fabs(forward - Dot(w, dw)) <= 1e-3 * (1 + std::fabs(forward)));
        y1 = y, dx1 = dx, dw1 = dw;
      } else {
        EXPECT_TRUE(SameBits(y, y1));
        EXPECT_TRUE(SameBits(dx, dx1));
        EXPECT_TRUE(SameBits(dw, dw1));
      }
    }
  }
}

}  // namespace
}  // namespace tf_glp::core

TF_GLP_TEST_MAIN
