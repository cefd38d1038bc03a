// Torch-free check of the kernel arithmetic (models/kernels/ops.h) for one variant: runs dot,
// products, attention, rmsnorm and both activations on fixed pseudo-random inputs and prints
// every result's bits, so that builds of different variants (including NEON under qemu) can be
// compared with `cmp`. Built and run by scripts/check_variants_cross.sh.
#include <cstdio>
#include <cstring>
#include <vector>

#include "ops.h"

static unsigned state = 12345u;
static float next() {  // uniform-ish in [-2, 2), exact in float
  state = state * 1664525u + 1013904223u;
  return static_cast<float>(static_cast<int>(state >> 9) - (1 << 22)) / static_cast<float>(1 << 21);
}
static void out(const float* p, int n) {
  for (int i = 0; i < n; ++i) {
    unsigned b;
    std::memcpy(&b, p + i, 4);
    std::printf("%08x\n", b);
  }
}

int main() {
  vs::FpMode mode;
  const int in = 77, outs = 13, R = 5;
  std::vector<float> x(R * in), w(outs * in), y(R * outs);
  for (auto& v : x) v = next();
  for (auto& v : w) v = next();
  for (int o = 0; o < outs; ++o) vs::products<R, 1>(x.data(), w.data(), y.data(), in, outs, o);
  out(y.data(), R * outs);
  float d = vs::dot(x.data(), w.data(), in);
  out(&d, 1);
  const int D = 24, S = 37;
  std::vector<float> q(D), k(S * D), v(S * D), o(D), qs(D), scores(S);
  for (auto& a : q) a = 3 * next();
  for (auto& a : k) a = next();
  for (auto& a : v) a = next();
  vs::attend(q.data(), k.data(), v.data(), o.data(), 2, S - 1, D, 0.2f, qs.data(), scores.data());
  out(o.data(), D);
  std::vector<float> g(50), u(50), m(50), n(50);
  for (int i = 0; i < 50; ++i) { g[i] = 8 * next(); u[i] = next(); }
  g[0] = -200.0f; g[1] = 200.0f; g[2] = -87.5f;
  vs::gated(g.data(), u.data(), m.data(), 50, false);
  out(m.data(), 50);
  vs::gated(g.data(), u.data(), m.data(), 50, true);
  out(m.data(), 50);
  vs::rmsnorm(g.data(), u.data(), n.data(), 50, 1e-6f);
  out(n.data(), 50);
  return 0;
}
