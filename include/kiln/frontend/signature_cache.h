// The cache of a hybridized block: compiled graphs keyed by the signature of a call (DESIGN.md
// section 6: training flag, frozen, and each argument's shape, dtype and device, or the text of a
// non-tensor argument). It is bounded: beyond its capacity (KILN_GRAPH_CACHE_SIZE, or set per
// cache) the least recently used entry is dropped, so calling a block with ever new shapes
// retraces without growing memory without end; a dropped graph's plans are freed once nothing
// else refers to them (cached_graph.h, "Lifetime").
//
// What it does not do: decide when to trace, or warn about retracing (the Python HybridBlock does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/runtime/dtype.h"
#include "kiln/runtime/shape.h"

namespace kiln {

class CachedGraph;

/// The key of a call: what makes a compiled graph fit it.
struct CallSignature {
  struct Arg {
    bool is_tensor = true;
    Shape shape;            ///< a tensor argument's
    DType dtype = DType::kFloat32;
    Device device;
    std::string constant;   ///< a non-tensor argument's text (Python's repr)
    friend bool operator==(const Arg& a, const Arg& b);
  };
  bool training = false;
  bool frozen = false;
  std::vector<Arg> args;
  friend bool operator==(const CallSignature& a, const CallSignature& b);
  size_t Hash() const;
};

class SignatureCache {
 public:
  struct Entry {
    std::shared_ptr<CachedGraph> graph;
    std::shared_ptr<void> extra;  ///< what the caller keeps with it (the output structure)
  };

  /// `capacity` 0: KILN_GRAPH_CACHE_SIZE's value.
  explicit SignatureCache(size_t capacity = 0);
  /// The entry of `key`, made the most recently used; nullptr when absent.
  const Entry* Find(const CallSignature& key);
  /// Inserts or replaces the entry of `key` as the most recently used; drops the least recently
  /// used ones beyond the capacity.
  void Insert(const CallSignature& key, Entry entry);
  void Clear();
  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }
  /// A smaller capacity drops the least recently used entries at once; at least 1.
  void set_capacity(size_t capacity);
  /// Entries dropped for the capacity so far.
  int64_t evictions() const { return evictions_; }
  /// The keys, most recently used first.
  std::vector<const CallSignature*> keys() const;

 private:
  struct KeyHash {
    size_t operator()(const CallSignature* k) const { return k->Hash(); }
  };
  struct KeyEq {
    bool operator()(const CallSignature* a, const CallSignature* b) const { return *a == *b; }
  };
  void Trim();
  size_t capacity_;
  int64_t evictions_ = 0;
  std::list<std::pair<CallSignature, Entry>> order_;  // most recently used first
  std::unordered_map<const CallSignature*, std::list<std::pair<CallSignature, Entry>>::iterator, KeyHash, KeyEq>
      index_;
};

}  // namespace kiln
