// The optimizer golden vectors recorded with PyTorch
// (tests/data/make_optimizer_golden.py -> optimizer_golden.txt), for the
// train/ optimizers and the server optimizer alike.
#ifndef COHORT_TESTS_DATA_OPTIMIZER_GOLDEN_H_
#define COHORT_TESTS_DATA_OPTIMIZER_GOLDEN_H_

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace cohort::testing {

// The start and the three gradients every case steps through (the server
// cases read them as deltas).
inline const std::vector<float> kGoldenStart = {0.5f, -1.25f, 2.0f, 0.0f, -0.75f};
inline const std::vector<std::vector<float>> kGoldenGrads = {{0.1f, -0.2f, 0.3f, -0.4f, 0.5f},
                                                             {-0.3f, 0.1f, 0.05f, 0.2f, -0.1f},
                                                             {0.25f, 0.25f, -0.5f, 0.0f, 0.125f}};

struct OptimizerGolden {
  std::string name, kind;  // kind: sgd, adam, adamw, server
  float lr = 0, weight_decay = 0, momentum = 0, dampening = 0;
  bool nesterov = false;
  float beta1 = 0, beta2 = 0, eps = 0;
  std::vector<double> expected;  // After the third step.
};

// Every case in the file; empty when it cannot be read.
inline std::vector<OptimizerGolden> ReadOptimizerGolden() {
  std::ifstream in(std::string(COHORT_TEST_DATA) + "/optimizer_golden.txt");
  std::vector<OptimizerGolden> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream f(line);
    OptimizerGolden c;
    int nesterov = 0;
    f >> c.name >> c.kind >> c.lr >> c.weight_decay >> c.momentum >> c.dampening >> nesterov >>
        c.beta1 >> c.beta2 >> c.eps;
    c.nesterov = nesterov != 0;
    double v;
    while (f >> v) c.expected.push_back(v);
    cases.push_back(c);
  }
  return cases;
}

}  // namespace cohort::testing

#endif  // COHORT_TESTS_DATA_OPTIMIZER_GOLDEN_H_
