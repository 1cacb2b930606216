// Movement ops beyond the conformance table: which ops return views of their input (and that
// writes through a view reach the base), the exact error types and messages, and the kernels'
// fast paths (tiled transpose, block concat/split, row gathers, partitioned take_grad) at sizes
// the table cannot afford, against plain loops written here.
#include <doctest/doctest.h>

#include <functional>
#include <numeric>
#include <random>

#include "test_util.h"
#include "kiln/frontend/autograd.h"
#include "kiln/frontend/dispatch.h"

using namespace kiln;
using V = std::vector<int64_t>;

namespace {
using kiln::testing::ErrorOf;
using kiln::testing::Has;
using kiln::testing::Contains;

std::vector<float> Iota(int64_t n, float start = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

Tensor Op(std::string_view op, std::initializer_list<Tensor> in, const ir::Attrs& attrs = {}) {
  return Invoke1(op, in, attrs);
}



}  // namespace

TEST_CASE("movement: layout ops return views that share storage") {
  Tensor x = Tensor::FromVector(Iota(24), {2, 3, 4});

  Tensor r = Op("reshape", {x}, {{"shape", V{4, -1}}});
  CHECK(r.SharesStorage(x));
  CHECK(r.shape() == Shape{4, 6});
  CHECK(r.ToVector<float>() == Iota(24));

  Tensor t = Op("transpose", {x}, {{"axes", V{2, 0, 1}}});
  CHECK(t.SharesStorage(x));
  CHECK(t.shape() == Shape{4, 2, 3});
  CHECK(t.ToVector<float>()[1] == 4.0f);  // t[0, 0, 1] = x[0, 1, 0]

  Tensor s = Op("slice", {x}, {{"begin", V{1, 2}}, {"end", V{2, 1}}, {"step", V{1, -1}}});
  CHECK(s.SharesStorage(x));
  CHECK(s.shape() == Shape{1, 1, 4});
  CHECK(s.ToVector<float>() == std::vector<float>{20, 21, 22, 23});

  Tensor e = Op("expand_dims", {x}, {{"axis", int64_t{-1}}});
  CHECK(e.SharesStorage(x));
  CHECK(e.shape() == Shape{2, 3, 4, 1});

  Tensor q = Op("squeeze", {e});
  CHECK(q.SharesStorage(x));
  CHECK(q.shape() == Shape{2, 3, 4});

  Tensor b = Op("broadcast_to", {Op("slice", {x}, {{"begin", V{0, 0}}, {"end", V{1, 1}}})},
                {{"shape", V{5, 2, 1, 4}}});
  CHECK(b.SharesStorage(x));
  CHECK(b.shape() == Shape{5, 2, 1, 4});
  std::vector<float> bv = b.ToVector<float>();
  CHECK(bv[0] == 0.0f);
  CHECK(bv[39] == 3.0f);

  // A view of a view of a transposed tensor: reshape that splits an axis still is a view...
  Tensor tt = Op("transpose", {Tensor::FromVector(Iota(12), {3, 4})});
  Tensor split_axis = Op("reshape", {tt}, {{"shape", V{2, 2, 3}}});
  CHECK(split_axis.SharesStorage(tt));
  CHECK(split_axis.ToVector<float>() == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  // ...but flattening it needs a copy.
  Tensor flat = Op("reshape", {tt}, {{"shape", V{-1}}});
  CHECK_FALSE(flat.SharesStorage(tt));
  CHECK(flat.ToVector<float>() == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
}

TEST_CASE("movement: writing through InvokeInto into a slice view updates the base") {
  Tensor base = Tensor::FromVector(std::vector<float>(12, 0.0f), {3, 4});
  Tensor view = Op("slice", {base}, {{"begin", V{1, 1}}, {"end", V{3, 4}}, {"step", V{1, 2}}});  // (2, 2)
  REQUIRE(view.SharesStorage(base));
  Tensor a = Tensor::FromVector<float>({1, 2, 3, 4}, {2, 2});
  Tensor ten = Tensor::FromVector<float>({10}, {1});
  InvokeInto(ir::FindOp("add"), std::vector<Tensor>{a, ten}, {}, std::vector<Tensor>{view});
  CHECK(base.ToVector<float>() == std::vector<float>{0, 0, 0, 0, 0, 11, 0, 12, 0, 13, 0, 14});

  // The copying kernels of view ops write the same values the view shows.
  Tensor x = Tensor::FromVector(Iota(6), {2, 3});
  Tensor out = Tensor::Empty({3, 2}, DType::kFloat32);
  InvokeInto(ir::FindOp("transpose"), std::vector<Tensor>{x}, {}, std::vector<Tensor>{out});
  CHECK(out.ToVector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("movement: errors are typed and say what is wrong") {
  Tensor x = Tensor::FromVector(Iota(6), {2, 3});
  std::string m = ErrorOf<ShapeError>([&] { Op("reshape", {x}, {{"shape", V{4, 2}}}); });
  CHECK(Contains(m, "(2, 3)"));
  CHECK(Contains(m, "(4, 2)"));
  m = ErrorOf<ShapeError>([&] { Op("reshape", {x}, {{"shape", V{-1, 4}}}); });
  CHECK(Contains(m, "(-1, 4)"));
  m = ErrorOf<ShapeError>([&] { Op("reshape", {x}, {{"shape", V{-1, -1}}}); });
  CHECK(Contains(m, "more than one -1"));
  m = ErrorOf<ShapeError>([&] { Op("transpose", {x}, {{"axes", V{0, 0}}}); });
  CHECK(Contains(m, "not a permutation"));
  CHECK(Contains(ErrorOf<ValueError>([&] { Op("slice", {x}, {{"step", V{1, 0}}}); }), "step of axis 1 is 0"));
  CHECK(Contains(ErrorOf<ShapeError>([&] { Op("slice", {x}, {{"begin", V{0, 0, 0}}}); }), "3 sliced axes"));
  m = ErrorOf<ShapeError>([&] { Op("squeeze", {x}, {{"axes", V{1}}}); });
  CHECK(Contains(m, "axis 1 of (2, 3) has size 3"));
  m = ErrorOf<ShapeError>([&] { Op("broadcast_to", {x}, {{"shape", V{4, 3}}}); });
  CHECK(Contains(m, "cannot broadcast (2, 3) to (4, 3)"));
  Tensor xi = Tensor::FromVector<int32_t>({1, 2, 3}, {1, 3});
  m = ErrorOf<DTypeError>([&] { Op("concat", {x, xi}); });
  CHECK(Contains(m, "input 1 has dtype int32"));
  m = ErrorOf<ShapeError>([&] { Op("concat", {x, Tensor::FromVector(Iota(4), {2, 2})}); });
  CHECK(Contains(m, "input 1 has shape (2, 2)"));
  CHECK(Contains(m, "axis 0"));
  m = ErrorOf<ShapeError>([&] { Op("stack", {x, Tensor::FromVector(Iota(3), {3})}); });
  CHECK(Contains(m, "input 1 has shape (3,)"));
  m = ErrorOf<ValueError>([&] {
    Invoke("split", std::vector<Tensor>{x}, {{"sections", V{2}}, {"axis", int64_t{1}}});
  });
  CHECK(Contains(m, "cannot be split into 2 equal parts"));
  m = ErrorOf<ValueError>([&] {
    Invoke("split", std::vector<Tensor>{x}, {{"sections", V{1, 1}}, {"axis", int64_t{1}}});
  });
  CHECK(Contains(m, "add up to 2"));
  CHECK(Contains(ErrorOf<DTypeError>([&] { Op("take", {x, x}); }), "indices must be int32 or int64"));

  // An index out of range is found by the kernel: the error surfaces at the sync point.
  Tensor idx = Tensor::FromVector<int64_t>({0, 1, 7}, {3});
  Tensor y = Op("take", {x, idx}, {{"axis", int64_t{1}}});
  m = ErrorOf<ValueError>([&] { y.ToVector<float>(); });
  CHECK(Contains(m, "index 7"));
  CHECK(Contains(m, "-3 to 2"));
  CHECK(Op("take", {x, Tensor::FromVector<int32_t>({-1}, {1})}).ToVector<float>() ==
        std::vector<float>{3, 4, 5});
  Tensor too_negative = Op("take", {x, Tensor::FromVector<int32_t>({-3}, {1})});
  CHECK(Contains(ErrorOf<ValueError>([&] { too_negative.WaitToRead(); }), "valid indices are -2 to 1"));
  // waitall reports the first of those errors once, then the engine is clean for what follows.
  CHECK(Contains(ErrorOf<ValueError>([&] { engine::Engine::Get().WaitForAll(); }), "index 7"));
  engine::Engine::Get().WaitForAll();
}

TEST_CASE("movement: one_hot gives all-off rows for indices outside 0..depth-1") {
  Tensor idx = Tensor::FromVector<int64_t>({1, -1, 3, 0}, {2, 2});
  Tensor y = Op("one_hot", {idx}, {{"depth", int64_t{3}}, {"on_value", 2.0}, {"off_value", -1.0}});
  CHECK(y.shape() == Shape{2, 2, 3});
  CHECK(y.ToVector<float>() == std::vector<float>{-1, 2, -1, -1, -1, -1, -1, -1, -1, 2, -1, -1});
}

TEST_CASE("movement: large transposes and reversed slices take the tiled and strided paths") {
  const int64_t R = 517, C = 1031;  // not multiples of the tile size
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kUInt8}) {
    CAPTURE(DTypeName(dt));
    std::vector<float> v(static_cast<size_t>(R * C));  // values every dtype holds exactly
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % (dt == DType::kUInt8 ? 251 : 2039));
    Tensor x = Tensor::FromVector(v, {R, C}).AsType(dt);
    Tensor t = Op("reshape", {Op("transpose", {x})}, {{"shape", V{-1}}});  // a copy through the view
    Tensor out = Tensor::Empty({C, R}, dt);
    InvokeInto(ir::FindOp("transpose"), std::vector<Tensor>{x}, {}, std::vector<Tensor>{out});
    std::vector<double> xv = x.ToVector<double>(), tv = t.ToVector<double>(), ov = out.ToVector<double>();
    int bad = 0;
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < R; ++j) {
        double want = xv[static_cast<size_t>(j * C + i)];
        bad += tv[static_cast<size_t>(i * R + j)] != want;
        bad += ov[static_cast<size_t>(i * R + j)] != want;
      }
    CHECK(bad == 0);
  }
  // A reversed slice with steps of -3 and -2, flattened by the strided row loop.
  Tensor x = Tensor::FromVector(Iota(300 * 400), {300, 400});
  Tensor s = Op("slice", {x}, {{"begin", V{-1, 398}}, {"end", V{-301, -401}}, {"step", V{-3, -2}}});
  CHECK(s.shape() == Shape{100, 200});
  std::vector<float> sv = Op("reshape", {s}, {{"shape", V{-1}}}).ToVector<float>();
  int bad = 0;
  for (int64_t i = 0; i < 100; ++i)
    for (int64_t j = 0; j < 200; ++j)
      bad += sv[static_cast<size_t>(i * 200 + j)] != static_cast<float>((299 - 3 * i) * 400 + 398 - 2 * j);
  CHECK(bad == 0);
}

TEST_CASE("movement: large concat, stack and split are exact") {
  std::vector<Tensor> parts;
  std::vector<int64_t> widths = {1, 700, 0, 333, 2048};
  float start = 0;
  for (int64_t w : widths) {
    parts.push_back(Tensor::FromVector(Iota(300 * w, start), {300, w}));
    start += static_cast<float>(300 * w);
  }
  Tensor cat = Invoke("concat", parts, {{"axis", int64_t{1}}})[0];
  const int64_t W = 1 + 700 + 333 + 2048;
  CHECK(cat.shape() == Shape{300, W});
  std::vector<float> cv = cat.ToVector<float>();
  int bad = 0;
  for (int64_t r = 0; r < 300; ++r) {
    int64_t col = 0;
    float base = 0;
    for (int64_t w : widths) {
      for (int64_t c = 0; c < w; ++c)
        bad += cv[static_cast<size_t>(r * W + col + c)] != base + static_cast<float>(r * w + c);
      col += w;
      base += static_cast<float>(300 * w);
    }
  }
  CHECK(bad == 0);

  // split undoes concat, also from a non-contiguous input.
  std::vector<Tensor> back =
      Invoke("split", std::vector<Tensor>{cat}, {{"sections", widths}, {"axis", int64_t{-1}}});
  REQUIRE(back.size() == widths.size());
  for (size_t i = 0; i < widths.size(); ++i) CHECK(back[i].ToVector<float>() == parts[i].ToVector<float>());
  Tensor catT = Op("transpose", {cat});
  std::vector<Tensor> rows =
      Invoke("split", std::vector<Tensor>{catT}, {{"sections", widths}, {"axis", int64_t{0}}});
  for (size_t i = 0; i < widths.size(); ++i)
    CHECK(rows[i].ToVector<float>() == Op("transpose", {parts[i]}).ToVector<float>());

  // concat of strided views along axis 0 and stack along the last axis.
  Tensor a = Tensor::FromVector(Iota(500 * 64), {500, 64});
  Tensor at = Op("transpose", {a});  // (64, 500), strided
  Tensor cat0 = Invoke("concat", std::vector<Tensor>{at, at}, {{"axis", int64_t{0}}})[0];
  std::vector<float> c0 = cat0.ToVector<float>(), atv = at.ToVector<float>();
  CHECK(std::equal(atv.begin(), atv.end(), c0.begin()));
  CHECK(std::equal(atv.begin(), atv.end(), c0.begin() + static_cast<int64_t>(atv.size())));
  Tensor b = Tensor::FromVector(Iota(500 * 64, 1e5f), {500, 64});
  Tensor st = Invoke("stack", std::vector<Tensor>{a, b}, {{"axis", int64_t{-1}}})[0];
  CHECK(st.shape() == Shape{500, 64, 2});
  std::vector<float> sv = st.ToVector<float>();
  bad = 0;
  for (int64_t i = 0; i < 500 * 64; ++i) {
    bad += sv[static_cast<size_t>(2 * i)] != static_cast<float>(i);
    bad += sv[static_cast<size_t>(2 * i + 1)] != 1e5f + static_cast<float>(i);
  }
  CHECK(bad == 0);
}

TEST_CASE("movement: take and take_grad at scale, with repeated indices") {
  std::mt19937 gen(7);
  const int64_t vocab = 1000, dim = 24, n = 20000;
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t& i : ids) i = static_cast<int64_t>(gen() % (2 * vocab)) - vocab;  // negatives wrap
  Tensor table = Tensor::FromVector(Iota(vocab * dim), {vocab, dim});
  Tensor idx = Tensor::FromVector(ids, {n});
  std::vector<float> got = Op("take", {table, idx}).ToVector<float>();
  int bad = 0;
  for (int64_t j = 0; j < n; ++j) {
    int64_t row =
        ids[static_cast<size_t>(j)] < 0 ? ids[static_cast<size_t>(j)] + vocab : ids[static_cast<size_t>(j)];
    for (int64_t c = 0; c < dim; ++c)
      bad += got[static_cast<size_t>(j * dim + c)] != static_cast<float>(row * dim + c);
  }
  CHECK(bad == 0);

  // Each of the three partitions of take_grad: over dx rows (outer 1), columns (few rows, wide),
  // and the leading axis (axis 1).
  struct Case {
    Shape dy;
    int64_t axis, dim;
  };
  for (const Case& c : {Case{{n, dim}, 0, vocab}, Case{{n, 4096}, 0, 3}, Case{{64, n, 2}, 1, vocab}}) {
    CAPTURE(c.dy.str());
    int64_t m = c.dy[static_cast<int>(c.axis)];
    std::vector<int64_t> ix(static_cast<size_t>(m));
    for (int64_t& i : ix) i = static_cast<int64_t>(gen() % static_cast<uint64_t>(c.dim));
    std::vector<float> g(static_cast<size_t>(c.dy.numel()));
    for (float& v : g) v = static_cast<float>(gen() % 5);  // small integers: sums are exact
    Tensor dx = Op("take_grad", {Tensor::FromVector(g, c.dy), Tensor::FromVector(ix, {m})},
                   {{"axis", c.axis}, {"dim", c.dim}});
    int64_t outer = c.axis == 0 ? 1 : c.dy[0], inner = c.dy.numel() / outer / m;
    std::vector<double> want(static_cast<size_t>(outer * c.dim * inner), 0.0);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t k = 0; k < inner; ++k)
          want[static_cast<size_t>((o * c.dim + ix[static_cast<size_t>(j)]) * inner + k)] +=
              g[static_cast<size_t>((o * m + j) * inner + k)];
    std::vector<double> have = dx.ToVector<double>();
    CHECK(have == want);
  }
}

TEST_CASE("movement: gradients flow through views, joins and gathers") {
  Tensor x = Tensor::FromVector(Iota(6), {2, 3});
  x.AttachGrad();
  Tensor y, first;
  {
    autograd::RecordScope record;
    Tensor s = Op("slice", {x}, {{"begin", V{0, 2}}, {"end", V{2, -4}}, {"step", V{1, -2}}});  // x[:, [2, 0]]
    Tensor t = Op("transpose", {s});
    Tensor rows = Op("take", {x, Tensor::FromVector<int64_t>({1, -1}, {2})});              // x[1] twice
    Tensor c = Invoke("concat", std::vector<Tensor>{t, rows}, {{"axis", int64_t{1}}})[0];  // (2, 5)
    y = Op("reshape", {c}, {{"shape", V{-1}}});
    // Only the first of split's outputs is used: the other's gradient is zeros.
    Tensor st = Invoke("stack", std::vector<Tensor>{x, x}, {{"axis", int64_t{-1}}})[0];
    first = Invoke("split", std::vector<Tensor>{st}, {{"sections", V{2}}, {"axis", int64_t{-1}}})[0];
  }
  autograd::Backward({y, first});
  // slice uses columns 0 and 2 once, take uses row 1 twice, the stacked copy adds one everywhere.
  CHECK(x.grad().ToVector<float>() == std::vector<float>{2, 1, 2, 4, 3, 4});
}
