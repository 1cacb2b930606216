// The profiler's recorder (see kiln/runtime/profiler.h): per-thread event buffers, GPU spans
// resolved from stream events, the Chrome trace-event JSON writer and the aggregate table.
//
// Each recording thread owns a Lane (its trace "tid"): events are appended under the lane's own
// mutex, which only a reader (a dump) ever contends. Lanes are never freed: a worker that exits
// leaves its events for the next dump. Lanes that are not threads (a GPU stream's device time)
// are found by name when the trace is read.
#include "kiln/runtime/profiler.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "kiln/runtime/atomic_file.h"
#include "kiln/runtime/env.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/gpu.h"

namespace kiln::profiler {

namespace {

struct Event {
  char ph; // 'X' or 'C'
  Category cat;
  std::string name;
  int64_t ts, dur;
  Args args;
};

struct PendingGpu { // a GPU task's device-time span, resolved when the trace is read
  gpurt::Event start, end;
  int device, stream_kind;
  int64_t issued_ns; // host time just before its start event was recorded: it cannot start earlier
  std::string name;
};

struct Lane {
  std::mutex mu;                 // guards events and gpu
  int tid = 0;                   // fixed at creation
  std::string name;              // guarded by the registry's mutex
  std::vector<Event> events;
  std::vector<PendingGpu> gpu;
};

struct Anchor { // a timing event of a device and the host time it completed at
  gpurt::Event event = nullptr;
  int64_t host_ns = 0;
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<Lane>> lanes;
  std::map<std::string, std::shared_ptr<Lane>> named; // lanes that are not threads
  int next_tid = 1;
  const int64_t epoch = Now();
  std::mutex anchor_mu;
  Anchor anchors[64];
};
Registry& R() {
  static Registry* r = new Registry(); // leaked: worker threads may record during exit
  return *r;
}

thread_local Lane* tls_lane = nullptr;

Lane* NewLane(std::string name) {
  auto lane = std::make_shared<Lane>();
  Registry& r = R();
  std::lock_guard<std::mutex> g(r.mu);
  lane->tid = r.next_tid++;
  lane->name = name.empty() ? "thread " + std::to_string(lane->tid) : std::move(name);
  r.lanes.push_back(lane);
  return lane.get();
}

Lane& ThisLane() {
  if (!tls_lane) tls_lane = NewLane("");
  return *tls_lane;
}

Lane& NamedLane(const std::string& name) { // under R().mu
  Registry& r = R();
  auto it = r.named.find(name);
  if (it != r.named.end()) return *it->second;
  auto lane = std::make_shared<Lane>();
  lane->tid = r.next_tid++;
  lane->name = name;
  r.lanes.push_back(lane);
  r.named[name] = lane;
  return *lane;
}

const char* CategoryName(Category c) {
  switch (c) {
  case kOperator: return "operator";
  case kSymbolic: return "symbolic";
  case kMemory: return "memory";
  case kCompile: return "compile";
  case kCollective: return "collective";
  case kGpu: return "gpu";
  default: return "other";
  }
}

const char* StreamName(int kind) {
  static const char* names[] = {"compute", "copy-in", "copy-out", "comm"};
  return kind >= 0 && kind < 4 ? names[kind] : "stream";
}

// Turns the GPU spans recorded so far into events on their streams' device-time lanes. The
// spans' events are waited for: a dump comes after the work it shows (waitall, or exit).
void ResolveGpu() {
  Registry& r = R();
  std::vector<std::shared_ptr<Lane>> lanes;
  {
    std::lock_guard<std::mutex> g(r.mu);
    lanes = r.lanes;
  }
  for (auto& lane : lanes) {
    std::vector<PendingGpu> pending;
    {
      std::lock_guard<std::mutex> g(lane->mu);
      pending.swap(lane->gpu);
    }
    for (PendingGpu& p : pending) {
      gpurt::Platform& plat = gpurt::Get();
      int64_t start = 0, end = 0;
      try {
        plat.EventSynchronize(p.end);
        Anchor a;
        {
          std::lock_guard<std::mutex> g(r.anchor_mu);
          a = r.anchors[p.device];
        }
        auto ms = [&](gpurt::Event e) { return static_cast<double>(plat.EventElapsedMs(a.event, e)); };
        // The anchor places the span; its length comes from its own two events, exactly: an
        // anchor a little early (a host time taken before its event completed) would otherwise
        // shorten the span where it is clamped to the time it was issued.
        const double dur_ms = std::max(0.0, static_cast<double>(plat.EventElapsedMs(p.start, p.end)));
        start = a.host_ns + static_cast<int64_t>(std::llround(ms(p.start) * 1e6));
        start = std::max(start, p.issued_ns); // float milliseconds are coarse far from the anchor
        end = start + std::max<int64_t>(1, std::llround(dur_ms * 1e6));
      } catch (...) { // a faulted device: its spans are dropped, the fault is reported elsewhere
        start = end = 0;
      }
      plat.EventDestroy(p.start), plat.EventDestroy(p.end);
      if (!end) continue;
      std::string name = "gpu(" + std::to_string(p.device) + ") " + StreamName(p.stream_kind) + " stream";
      std::lock_guard<std::mutex> g(r.mu);
      Lane& l = NamedLane(name);
      std::lock_guard<std::mutex> g2(l.mu);
      l.events.push_back({'X', kGpu, std::move(p.name), start, end - start, {}});
    }
  }
}

void AppendEscaped(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
}

void AppendUs(std::string& out, int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ns) / 1e3);
  out += buf;
}

void AppendNumber(std::string& out, double v) {
  char buf[32];
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.6g", v);
  out += buf;
}

// Every lane's events, copied under each lane's lock.
struct Snapshot {
  struct L {
    int tid;
    std::string name;
    std::vector<Event> events;
  };
  std::vector<L> lanes;
};
Snapshot Take() {
  ResolveGpu();
  Registry& r = R();
  std::vector<std::shared_ptr<Lane>> lanes;
  Snapshot s;
  {
    std::lock_guard<std::mutex> g(r.mu);  // names change under it (NameThisThread)
    lanes = r.lanes;
    for (auto& lane : lanes) s.lanes.push_back({lane->tid, lane->name, {}});
  }
  for (size_t i = 0; i < lanes.size(); ++i) {
    std::lock_guard<std::mutex> g(lanes[i]->mu);
    s.lanes[i].events = lanes[i]->events;
  }
  return s;
}

// The bound on events kept in memory (KILN_PROFILE_MAX_EVENTS): a long profiled run keeps its
// first events and counts the rest, instead of growing without bound (one warning, and the
// trace's "otherData" says how many were dropped).
std::atomic<int64_t> g_kept{0};
std::atomic<int64_t> g_dropped{0};

int64_t MaxEvents() {
  static const int64_t n = std::max<int64_t>(1, env::GetInt("KILN_PROFILE_MAX_EVENTS"));
  return n;
}

bool Admit() {
  if (g_kept.fetch_add(1, std::memory_order_relaxed) < MaxEvents()) return true;
  g_kept.fetch_sub(1, std::memory_order_relaxed);
  if (g_dropped.fetch_add(1, std::memory_order_relaxed) == 0)
    std::fprintf(stderr,
                 "kiln profiler: %lld events are kept in memory (KILN_PROFILE_MAX_EVENTS); later events "
                 "are dropped: dump() with finished=True (or dumps(reset=True)) to start afresh, or raise the "
                 "bound\n",
                 static_cast<long long>(MaxEvents()));
  return false;
}

// The aggregate statistics of events the trace has forgotten (ClearTrace: a dump that finished),
// kept until Clear(), as MXNet keeps its aggregate statistics until dumps(reset=True).
struct Stat {
  int64_t count = 0;
  double total = 0, min = 0, max = 0;
  void Add(double v) {
    min = count ? std::min(min, v) : v, max = count ? std::max(max, v) : v;
    total += v, ++count;
  }
  void Merge(const Stat& o) {
    if (!o.count) return;
    min = count ? std::min(min, o.min) : o.min, max = count ? std::max(max, o.max) : o.max;
    total += o.total, count += o.count;
  }
};
using StatTable = std::map<std::string, std::map<std::string, Stat>>; // category -> name -> stat

void AddToStats(StatTable& t, const Event& e) {
  if (e.ph == 'X')
    t[CategoryName(e.cat)][e.name].Add(static_cast<double>(e.dur) / 1e6);
  else
    t["Device Storage"][e.name].Add(e.args.value[0] / 1e3);
}

struct CarriedStats {
  std::mutex mu;
  StatTable table;
};
CarriedStats& Carried() {
  static CarriedStats* c = new CarriedStats(); // leaked, as the registry
  return *c;
}

// Forgets every lane's events; with `keep_stats`, their statistics are carried over first.
void DropEvents(bool keep_stats) {
  ResolveGpu(); // destroys the pending spans' events
  Registry& r = R();
  StatTable folded;
  {
    std::lock_guard<std::mutex> g(r.mu);
    for (auto& lane : r.lanes) {
      std::lock_guard<std::mutex> g2(lane->mu);
      if (keep_stats)
        for (const Event& e : lane->events) AddToStats(folded, e);
      lane->events.clear();
    }
  }
  g_kept.store(0, std::memory_order_relaxed);
  g_dropped.store(0, std::memory_order_relaxed);
  CarriedStats& c = Carried();
  std::lock_guard<std::mutex> g(c.mu);
  if (!keep_stats) c.table.clear();
  for (const auto& [cat, names] : folded)
    for (const auto& [name, stat] : names) c.table[cat][name].Merge(stat);
}

} // namespace

void Complete(Category c, std::string_view name, int64_t start_ns, int64_t end_ns, const Args& args) {
  if (!Admit()) return;
  Lane& l = ThisLane();
  std::lock_guard<std::mutex> g(l.mu);
  l.events.push_back({'X', c, std::string(name), start_ns, end_ns - start_ns, args});
}

void CompleteOnLane(Category c, std::string_view lane, std::string_view name, int64_t start_ns,
                    int64_t end_ns, const Args& args) {
  if (!Admit()) return;
  Registry& r = R();
  std::lock_guard<std::mutex> g(r.mu);
  Lane& l = NamedLane(std::string(lane));
  std::lock_guard<std::mutex> g2(l.mu);
  l.events.push_back({'X', c, std::string(name), start_ns, end_ns - start_ns, args});
}

void Counter(Category c, std::string_view name, const char* key, double value) {
  if (!Admit()) return;
  Lane& l = ThisLane();
  std::lock_guard<std::mutex> g(l.mu);
  l.events.push_back({'C', c, std::string(name), Now(), 0, Args(key, value)});
}

void NameThisThread(std::string_view name) {
  if (!tls_lane) {
    tls_lane = NewLane(std::string(name));
    return;
  }
  std::lock_guard<std::mutex> g(R().mu);
  tls_lane->name = name;
}

void SetRecording(uint32_t mask) {
  if (mask && !tls_lane) NameThisThread("main"); // the thread that starts the profiler, usually
  detail::g_recording.store(mask & kAll, std::memory_order_relaxed);
}
uint32_t Recording() { return detail::g_recording.load(std::memory_order_relaxed); }

void Clear() { DropEvents(/*keep_stats=*/false); }
void ClearTrace() { DropEvents(/*keep_stats=*/true); }

int64_t EventCount() {
  int64_t n = 0;
  for (const auto& l : Take().lanes) n += static_cast<int64_t>(l.events.size());
  return n;
}

std::string TraceJson() {
  Snapshot s = Take();
  const int64_t epoch = R().epoch;
  const int pid = static_cast<int>(getpid());
  const std::string p = std::to_string(pid);
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + p + ",\"tid\":0,\"args\":{\"name\":\"kiln\"}}";
  for (const auto& l : s.lanes) {
    if (l.events.empty()) continue;
    const std::string tid = std::to_string(l.tid);
    out += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + p + ",\"tid\":" + tid +
           ",\"args\":{\"name\":\"";
    AppendEscaped(out, l.name);
    out += "\"}}";
    out += ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" + p + ",\"tid\":" + tid +
           ",\"args\":{\"sort_index\":" + tid + "}}";
    for (const Event& e : l.events) {
      out += ",\n{\"name\":\"";
      AppendEscaped(out, e.name);
      out += "\",\"cat\":\"";
      out += CategoryName(e.cat);
      out += "\",\"ph\":\"";
      out += e.ph;
      out += "\",\"pid\":" + p + ",\"tid\":" + tid + ",\"ts\":";
      AppendUs(out, e.ts - epoch);
      if (e.ph == 'X') out += ",\"dur\":", AppendUs(out, e.dur);
      out += ",\"args\":{";
      for (int i = 0; i < 3 && e.args.key[i]; ++i) {
        if (i) out += ',';
        out += '"', out += e.args.key[i], out += "\":";
        AppendNumber(out, e.args.value[i]);
      }
      out += "}}";
    }
  }
  out += "\n],\"otherData\":{\"max_events\":" + std::to_string(MaxEvents()) +
         ",\"dropped_events\":" + std::to_string(g_dropped.load(std::memory_order_relaxed)) + "}}\n";
  return out;
}

void WriteTrace(const std::string& path) {
  try {
    WriteFileAtomic(path, TraceJson());
  } catch (const FileError& e) {
    KILN_THROW(FileError) << "profiler: " << e.what();
  }
}

std::string AggregateTable() {
  StatTable by_cat;
  for (const auto& l : Take().lanes)
    for (const Event& e : l.events) AddToStats(by_cat, e);
  {
    CarriedStats& c = Carried();
    std::lock_guard<std::mutex> g(c.mu);
    for (const auto& [cat, names] : c.table)
      for (const auto& [name, stat] : names) by_cat[cat][name].Merge(stat);
  }
  std::ostringstream o;
  o << "Profile Statistics:\n\tNote the difference in units for different entries.\n";
  char line[256];
  for (const auto& [cat, names] : by_cat) {
    const bool mem = cat == "Device Storage";
    o << cat << "\n=================\n";
    if (mem) {
      std::snprintf(line, sizeof line, "%-40s %12s %16s %16s %16s\n", "Name", "Total Count", "Min Use  (kB)",
                    "Max Use  (kB)", "Avg Use  (kB)");
      o << line;
      std::snprintf(line, sizeof line, "%-40s %12s %16s %16s %16s\n", "----", "-----------", "-------------",
                    "-------------", "-------------");
    } else {
      std::snprintf(line, sizeof line, "%-40s %12s %16s %16s %16s %16s\n", "Name", "Total Count", "Time (ms)",
                    "Min Time (ms)", "Max Time (ms)", "Avg Time (ms)");
      o << line;
      std::snprintf(line, sizeof line, "%-40s %12s %16s %16s %16s %16s\n", "----", "-----------", "---------",
                    "-------------", "-------------", "-------------");
    }
    o << line;
    for (const auto& [name, s] : names) {
      std::string n = name.size() > 40 ? name.substr(0, 37) + "..." : name;
      double mean = s.total / static_cast<double>(s.count);
      if (mem)
        std::snprintf(line, sizeof line, "%-40s %12lld %16.4f %16.4f %16.4f\n", n.c_str(),
                      static_cast<long long>(s.count), s.min, s.max, mean);
      else
        std::snprintf(line, sizeof line, "%-40s %12lld %16.4f %16.4f %16.4f %16.4f\n", n.c_str(),
                      static_cast<long long>(s.count), s.total, s.min, s.max, mean);
      o << line;
    }
    o << "\n";
  }
  return o.str();
}

GpuSpan GpuBegin(void* stream, int device) {
  gpurt::Platform& plat = gpurt::Get();
  auto s = static_cast<gpurt::Stream>(stream);
  if (device < 0 || device >= 64) return {};
  Registry& r = R();
  {
    std::lock_guard<std::mutex> g(r.anchor_mu);
    Anchor& a = r.anchors[device];
    if (!a.event) { // once per device: an event on an idle stream, completed at a known host time
      // It completed between the record and the synchronize's return; the midpoint of the
      // tightest of a few tries is kept (a stream slow to wake widens a window by milliseconds).
      plat.StreamSynchronize(s);
      int64_t best = -1;
      for (int i = 0; i < 5; ++i) {
        gpurt::Event e = plat.EventCreate(/*timing=*/true);
        const int64_t before = Now();
        plat.EventRecord(e, s);
        plat.EventSynchronize(e);
        const int64_t window = Now() - before;
        if (best >= 0 && window >= best) {
          plat.EventDestroy(e);
          continue;
        }
        if (a.event) plat.EventDestroy(a.event);
        a.event = e, a.host_ns = before + window / 2, best = window;
        if (window < 50'000) break; // within 50 us: as good as it gets
      }
    }
  }
  gpurt::Event e = plat.EventCreate(/*timing=*/true);
  const int64_t issued = Now(); // the stream may start the work before GpuEnd is reached
  plat.EventRecord(e, s);
  return {e, stream, issued};
}

void GpuEnd(const GpuSpan& s, int device, int stream_kind, std::string_view name) {
  if (!s.start) return;
  gpurt::Platform& plat = gpurt::Get();
  if (!Admit()) { // past the bound: no span (its start event is not kept alive either)
    plat.EventDestroy(static_cast<gpurt::Event>(s.start));
    return;
  }
  gpurt::Event e = plat.EventCreate(/*timing=*/true);
  plat.EventRecord(e, static_cast<gpurt::Stream>(s.stream));
  Lane& l = ThisLane();
  std::lock_guard<std::mutex> g(l.mu);
  l.gpu.push_back(
      {static_cast<gpurt::Event>(s.start), e, device, stream_kind, s.issued_ns, std::string(name)});
}

void StartFromEnvironment() {
  static const bool started = [] {
    std::string path = env::Get("KILN_PROFILE");
    if (path.empty() || path == "0") return false;
    { // a bad path fails now, not after the whole run
      std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
      if (access(dir.c_str(), W_OK) != 0)
        KILN_THROW(ValueError) << "KILN_PROFILE=" << path << ": cannot write in '" << dir
                               << "'; expected the path of a trace file in an existing, writable directory";
    }
    static std::string* where = new std::string(path);
    SetRecording(kAll);
    // Registered by Engine::Get before its drain at exit: handlers run in reverse, so the
    // engine's queued work finishes before the trace is written.
    std::atexit([] {
      try {
        SetRecording(0);
        WriteTrace(*where);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kiln: %s\n", e.what());
      }
    });
    return true;
  }();
  (void)started;
}

} // namespace kiln::profiler
