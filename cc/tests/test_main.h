// A minimal test harness for the native core, so that its tests build with
// nothing but a C++ compiler (also on GPU machines without TensorFlow or
// GoogleTest). Each test binary prints one line per test and a closing
// "N passed, N failed" line, and exits non-zero on any failure.
#ifndef TF_GLP_CC_TESTS_TEST_MAIN_H_
#define TF_GLP_CC_TESTS_TEST_MAIN_H_

#include <cstdio>
#include <exception>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace tf_glp::testing {

struct TestCase {
  const char* name;
  std::function<void()> body;
};

inline std::vector<TestCase>& Registry() {
  static std::vector<TestCase> tests;
  return tests;
}

struct Registrar {
  Registrar(const char* name, std::function<void()> body) {
    Registry().push_back({name, std::move(body)});
  }
};

class Failure : public std::exception {
 public:
  explicit Failure(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

inline int RunAllTests() {
  int passed = 0, failed = 0;
  for (const TestCase& test : Registry()) {
    try {
      test.body();
      ++passed;
      std::printf("[ OK ] %s\n", test.name);
    } catch (const std::exception& e) {
      ++failed;
      std::printf("[FAIL] %s: %s\n", test.name, e.what());
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}

}  // namespace tf_glp::testing

#define TF_GLP_CONCAT_INNER(a, b) a##b
#define TF_GLP_CONCAT(a, b) TF_GLP_CONCAT_INNER(a, b)
#define TEST(name)                                                   \
  static void name();                                                \
  static ::tf_glp::testing::Registrar TF_GLP_CONCAT(registrar_, name)( \
      #name, &name);                                                 \
  static void name()

#define EXPECT_TRUE(cond)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::ostringstream tf_glp_message;                                   \
      tf_glp_message << __FILE__ << ":" << __LINE__ << ": " #cond " is false"; \
      throw ::tf_glp::testing::Failure(tf_glp_message.str());              \
    }                                                                      \
  } while (0)

#define EXPECT_EQ(a, b)                                                      \
  do {                                                                       \
    const auto tf_glp_a = (a);                                               \
    const auto tf_glp_b = (b);                                               \
    if (!(tf_glp_a == tf_glp_b)) {                                           \
      std::ostringstream tf_glp_message;                                     \
      tf_glp_message << __FILE__ << ":" << __LINE__ << ": " #a " == " #b     \
                     << " failed: " << tf_glp_a << " vs " << tf_glp_b;       \
      throw ::tf_glp::testing::Failure(tf_glp_message.str());                \
    }                                                                        \
  } while (0)

#define TF_GLP_TEST_MAIN \
  int main() { return ::tf_glp::testing::RunAllTests(); }

#endif  // TF_GLP_CC_TESTS_TEST_MAIN_H_
