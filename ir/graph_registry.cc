// The registry of compiled graphs behind call_graph ids (see include/kiln/ir/call_graph.h): ids
// map to weak references, so an entry lives exactly as long as the GraphRefs to it.
#include <mutex>
#include <unordered_map>

#include "kiln/ir/call_graph.h"
#include "kiln/runtime/error.h"

namespace kiln::ir {

namespace {
struct Registry {
  std::mutex mu;
  int64_t next_id = 0;
  std::unordered_map<int64_t, std::weak_ptr<RegisteredGraph>> entries;
};
Registry& Get() {
  static auto* r = new Registry();  // leaked: entries may be released while statics are destroyed
  return *r;
}
}  // namespace

RegisteredGraph::~RegisteredGraph() {
  Registry& r = Get();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.entries.find(id_);
  // The weak reference is expired by now; only this entry's own id is erased.
  if (it != r.entries.end() && it->second.expired()) r.entries.erase(it);
  // payload_ is destroyed after this body, with the lock released: it may hold GraphRefs.
}

GraphRef RegisterGraph(GraphSignature sig, std::unique_ptr<GraphPayload> payload) {
  Registry& r = Get();
  std::lock_guard<std::mutex> g(r.mu);
  GraphRef e(new RegisteredGraph(r.next_id++, std::move(sig), std::move(payload)));
  r.entries.emplace(e->id(), e);
  return e;
}

GraphRef FindGraph(int64_t id) {
  Registry& r = Get();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.entries.find(id);
  GraphRef e = it == r.entries.end() ? nullptr : it->second.lock();
  if (!e) {
    if (id >= 0 && id < r.next_id)
      KILN_THROW(ValueError) << "call_graph: compiled graph " << id
                             << " was freed (the block or cache that held it dropped it); run the block "
                                "again to compile it anew";
    KILN_THROW(ValueError) << "call_graph: no compiled graph has id " << id;
  }
  return e;
}

GraphSignature GetGraphSignature(int64_t id) { return FindGraph(id)->signature(); }

size_t NumRegisteredGraphs() {
  Registry& r = Get();
  std::lock_guard<std::mutex> g(r.mu);
  size_t n = 0;
  for (const auto& [id, w] : r.entries) n += !w.expired();
  return n;
}

}  // namespace kiln::ir
