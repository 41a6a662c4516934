// host_reduce against a plain in-order float32 reference, bitwise, for every
// dtype pair, N, odd size, unaligned view, instruction set and thread count.
#include "cc/core/host_reduce.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cc/core/thread_pool.h"
#include "cc/tests/test_main.h"
#include "cc/tests/test_util.h"

namespace tf_glp::core {
namespace {

using testing::LoadAsFloat;
using testing::RandomBuffer;

struct Case {
  DType in;
  DType out;
  int n;
  int64_t size;
  int offset;  // elements, to test unaligned views
  ReduceOp op;
};

std::vector<uint8_t> Reference(const Case& c,
                               const std::vector<const void*>& inputs) {
  std::vector<uint8_t> out(c.size * DTypeSize(c.out));
  for (int64_t i = 0; i < c.size; ++i) {
    float acc = LoadAsFloat(c.in, inputs[0], i);
    for (int j = 1; j < c.n; ++j) acc = acc + LoadAsFloat(c.in, inputs[j], i);
    if (c.op == ReduceOp::kMean) acc = acc / static_cast<float>(c.n);
    if (c.out == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &acc, 4);
    } else if (c.out == DType::kBFloat16) {
      const BFloat16 b = ToBFloat16(acc);
      std::memcpy(out.data() + 2 * i, &b, 2);
    } else {
      const Float16 h = ToFloat16(acc);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

std::vector<uint8_t> Run(const Case& c, const std::vector<const void*>& inputs,
                         const ParallelRunner& runner, Isa isa) {
  std::vector<uint8_t> storage(c.size * DTypeSize(c.out) + 64, 0xAB);
  uint8_t* out = storage.data() + c.offset * DTypeSize(c.out);
  HostReduceSpec spec;
  spec.inputs = inputs.data();
  spec.num_inputs = c.n;
  spec.input_dtype = c.in;
  spec.output = out;
  spec.output_dtype = c.out;
  spec.num_elements = c.size;
  spec.op = c.op;
  const std::string error = HostReduce(spec, runner, isa);
  if (!error.empty()) throw testing::Failure(error);
  return std::vector<uint8_t>(out, out + c.size * DTypeSize(c.out));
}

void CheckCase(const Case& c, const std::vector<const ParallelRunner*>& runners) {
  std::mt19937 rng(c.n * 7919 + c.size);
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<const void*> inputs;
  for (int j = 0; j < c.n; ++j) {
    buffers.push_back(RandomBuffer(c.in, c.size + c.offset, rng, 1.0f, true));
  }
  for (int j = 0; j < c.n; ++j) {
    inputs.push_back(buffers[j].data() + c.offset * DTypeSize(c.in));
  }
  const std::vector<uint8_t> want = Reference(c, inputs);
  for (Isa isa : testing::SupportedIsas()) {
    for (const ParallelRunner* runner : runners) {
      const std::vector<uint8_t> got = Run(c, inputs, *runner, isa);
      if (got != want) {
        throw testing::Failure(
            std::string("mismatch: in=") + DTypeName(c.in) + " out=" +
            DTypeName(c.out) + " n=" + std::to_string(c.n) + " size=" +
            std::to_string(c.size) + " offset=" + std::to_string(c.offset) +
            " isa=" + IsaName(isa) + " threads=" +
            std::to_string(runner->NumThreads()));
      }
    }
  }
}

TEST(MatchesInOrderReferenceBitwise) {
  SerialRunner serial;
  ThreadPool pool3(3);
  const std::vector<const ParallelRunner*> runners = {&serial, &pool3};
  for (DType in : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (DType out : {in, DType::kFloat32}) {
      for (int n : {1, 2, 3, 4, 5, 8, 9, 16}) {
        for (int64_t size : {1, 7, 64, 1023, 70001}) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
            CheckCase({in, out, n, size, static_cast<int>(size % 3), op}, runners);
          }
        }
      }
    }
  }
}

TEST(LargeStreamingOutputs) {
  // Above the non-temporal store threshold, with an unaligned start.
  SerialRunner serial;
  ThreadPool pool2(2);
  ThreadPool pool7(7);
  const int64_t big = (1 << 21) + 3;  // 2^21+3 float32 outputs = 8 MiB + 12 B
  CheckCase({DType::kFloat32, DType::kFloat32, 4, big, 1, ReduceOp::kSum},
            {&serial, &pool2, &pool7});
  CheckCase({DType::kBFloat16, DType::kBFloat16, 3, (1 << 22) + 5, 3,
             ReduceOp::kMean},
            {&pool2});
  CheckCase({DType::kFloat16, DType::kFloat32, 2, (1 << 20) + 3, 0,
             ReduceOp::kSum},
            {&pool2});
}

TEST(OutputMayAliasFirstInput) {
  std::mt19937 rng(5);
  const int64_t size = 100003;
  auto a = RandomBuffer(DType::kFloat32, size, rng);
  auto b = RandomBuffer(DType::kFloat32, size, rng);
  std::vector<const void*> inputs = {a.data(), b.data()};
  const std::vector<uint8_t> want =
      Reference({DType::kFloat32, DType::kFloat32, 2, size, 0, ReduceOp::kSum},
                inputs);
  ThreadPool pool(2);
  HostReduceSpec spec;
  spec.inputs = inputs.data();
  spec.num_inputs = 2;
  spec.output = a.data();
  spec.num_elements = size;
  EXPECT_EQ(HostReduce(spec, pool), std::string());
  EXPECT_TRUE(std::memcmp(a.data(), want.data(), want.size()) == 0);
}

TEST(DivisorAndFiniteCheckInTheSamePass) {
  // Divided sums match the in-order reference divided in float32, and the
  // finite flag is cleared by an infinity, a NaN or a sum that overflows, at
  // any position (vector body, 4-way body, scalar tail), for every
  // instruction set and thread count.
  SerialRunner serial;
  ThreadPool pool3(3);
  const float divisor = 32768.0f;
  for (int n : {1, 2, 3, 9}) {
    for (int64_t size : {1, 37, 70001, (1 << 20) + 3}) {
      std::mt19937 rng(n * 31 + size);
      std::vector<std::vector<uint8_t>> buffers;
      std::vector<const void*> inputs;
      for (int j = 0; j < n; ++j) {
        buffers.push_back(RandomBuffer(DType::kFloat32, size, rng, 1000.0f, true));
        inputs.push_back(buffers.back().data());
      }
      std::vector<float> want(size);
      for (int64_t i = 0; i < size; ++i) {
        float acc = LoadAsFloat(DType::kFloat32, inputs[0], i);
        for (int j = 1; j < n; ++j) acc = acc + LoadAsFloat(DType::kFloat32, inputs[j], i);
        want[i] = acc / divisor;
      }
      for (int64_t bad_at : {int64_t{-1}, int64_t{0}, size / 2, size - 1}) {
        for (float bad : {INFINITY, NAN, 3.0e38f}) {
          if (bad_at < 0 && bad != INFINITY) continue;  // one all-finite run
          float* first = reinterpret_cast<float*>(buffers[0].data());
          float* last = reinterpret_cast<float*>(buffers[n - 1].data());
          const int64_t at = bad_at >= 0 ? bad_at : 0;
          const float saved_first = first[at], saved_last = last[at];
          // 3e38 is finite; only the sum of two of them overflows.
          if (bad_at >= 0) last[at] = bad;
          if (bad_at >= 0 && bad == 3.0e38f) first[at] = bad;
          const bool expect_finite = bad_at < 0 || (bad == 3.0e38f && n == 1);
          for (Isa isa : testing::SupportedIsas()) {
            for (const ParallelRunner* runner : {static_cast<const ParallelRunner*>(&serial),
                                                 static_cast<const ParallelRunner*>(&pool3)}) {
              std::vector<float> out(size, -1.0f);
              bool finite = !expect_finite;
              HostReduceSpec spec;
              spec.inputs = inputs.data();
              spec.num_inputs = n;
              spec.output = out.data();
              spec.num_elements = size;
              spec.divisor = &divisor;
              spec.all_finite = &finite;
              EXPECT_EQ(HostReduce(spec, *runner, isa), std::string());
              EXPECT_EQ(finite, expect_finite);
              if (bad_at < 0) {
                EXPECT_TRUE(std::memcmp(out.data(), want.data(), 4 * size) == 0);
              }
            }
          }
          first[at] = saved_first;
          last[at] = saved_last;
        }
      }
    }
  }
}

TEST(BadArgumentsAreReported) {
  SerialRunner serial;
  float x = 1.0f, y = 0.0f;
  const void* inputs[] = {&x, nullptr};
  HostReduceSpec spec;
  spec.inputs = inputs;
  spec.output = &y;
  spec.num_elements = 1;
  spec.num_inputs = 0;
  EXPECT_TRUE(HostReduce(spec, serial).find("at least one input, got 0") !=
              std::string::npos);
  spec.num_inputs = 2;
  EXPECT_TRUE(HostReduce(spec, serial).find("input 1 is a null buffer") !=
              std::string::npos);
  spec.num_inputs = 1;
  spec.input_dtype = DType::kBFloat16;
  spec.output_dtype = DType::kFloat16;
  EXPECT_TRUE(HostReduce(spec, serial).find("got float16") != std::string::npos);
  spec.output_dtype = DType::kBFloat16;
  spec.num_elements = -1;
  EXPECT_TRUE(HostReduce(spec, serial).find("negative") != std::string::npos);
  spec.num_elements = 0;  // nothing to do is fine
  EXPECT_EQ(HostReduce(spec, serial), std::string());
  const float four = 4.0f;
  spec.divisor = &four;
  spec.op = ReduceOp::kMean;
  EXPECT_TRUE(HostReduce(spec, serial).find("divisor only for a sum") != std::string::npos);
}

}  // namespace
}  // namespace tf_glp::core

TF_GLP_TEST_MAIN
