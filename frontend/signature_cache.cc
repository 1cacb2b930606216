// The bounded (least recently used) cache of a hybridized block's compiled graphs, keyed by call
// signature (see include/kiln/frontend/signature_cache.h).
#include "kiln/frontend/signature_cache.h"

#include <functional>

#include "kiln/frontend/cached_graph.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"

namespace kiln {

bool operator==(const CallSignature::Arg& a, const CallSignature::Arg& b) {
  if (a.is_tensor != b.is_tensor) return false;
  if (!a.is_tensor) return a.constant == b.constant;
  return a.shape == b.shape && a.dtype == b.dtype && a.device == b.device;
}

bool operator==(const CallSignature& a, const CallSignature& b) {
  return a.training == b.training && a.frozen == b.frozen && a.args == b.args;
}

size_t CallSignature::Hash() const {
  size_t h = (training ? 0x9e3779b9u : 0) ^ (frozen ? 0x85ebca6bu : 0);
  auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (const Arg& a : args) {
    if (!a.is_tensor) {
      mix(std::hash<std::string>()(a.constant));
      continue;
    }
    for (int d = 0; d < a.shape.rank(); ++d) mix(static_cast<size_t>(a.shape[d]));
    mix(static_cast<size_t>(a.shape.rank()));
    mix(static_cast<size_t>(a.dtype));
    mix(static_cast<size_t>(a.device.type) * 131 + static_cast<size_t>(a.device.index));
  }
  return h;
}

namespace {
size_t DefaultCapacity() {
  int64_t n = env::GetInt("KILN_GRAPH_CACHE_SIZE");
  if (n < 1)
    KILN_THROW(ValueError) << "KILN_GRAPH_CACHE_SIZE=" << n << ": a hybridized block must be able to keep at "
                           << "least one compiled graph; set it to 1 or more (the default is 64)";
  return static_cast<size_t>(n);
}
}  // namespace

SignatureCache::SignatureCache(size_t capacity) : capacity_(capacity ? capacity : DefaultCapacity()) {}

const SignatureCache::Entry* SignatureCache::Find(const CallSignature& key) {
  auto it = index_.find(&key);
  if (it == index_.end()) return nullptr;
  order_.splice(order_.begin(), order_, it->second);  // iterators (and the key's address) stay valid
  return &it->second->second;
}

void SignatureCache::Insert(const CallSignature& key, Entry entry) {
  if (auto it = index_.find(&key); it != index_.end()) {
    it->second->second = std::move(entry);
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  order_.emplace_front(key, std::move(entry));
  index_.emplace(&order_.front().first, order_.begin());
  Trim();
}

void SignatureCache::Trim() {
  while (order_.size() > capacity_) {
    index_.erase(&order_.back().first);
    order_.pop_back();
    ++evictions_;
  }
}

void SignatureCache::Clear() {
  index_.clear();
  order_.clear();
}

void SignatureCache::set_capacity(size_t capacity) {
  if (capacity < 1)
    KILN_THROW(ValueError) << "graph cache capacity must be at least 1, got " << capacity;
  capacity_ = capacity;
  Trim();
}

std::vector<const CallSignature*> SignatureCache::keys() const {
  std::vector<const CallSignature*> out;
  for (const auto& [k, e] : order_) out.push_back(&k);
  return out;
}

}  // namespace kiln
