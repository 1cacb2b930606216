// What the engine and eager dispatch ask of Python (installed by kiln/__init__.py):
//  - the interrupt check of the engine's sync points (kiln/runtime/interrupt.h): a Ctrl-C while
//    waitall(), asnumpy(), item() or wait_to_read() waits raises KeyboardInterrupt within about
//    kInterruptPoll, and the queued work goes on in the background;
//  - the blocking hook (interrupt.h): the engine's backpressure wait lets go of the GIL;
//  - the call-site provider (kiln/frontend/call_site.h): the user's file:line that queued an op,
//    which the error of a failed engine task names.
// What it does not do: interrupt a kernel that runs. Bindings that release the GIL before they
// queue work name the call site first (CallSiteScope, call_site.h).
#include <cstring>
#include <string>
#include <unordered_set>

#include "bind.h"
#include "call_site.h"
#include "kiln/frontend/call_site.h"
#include "kiln/runtime/interrupt.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && __has_include(<internal/pycore_frame.h>)
#define KILN_PY_FRAMES_311 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#else
#define KILN_PY_FRAMES_311 0
#endif

namespace kiln::py {
namespace {

unsigned long g_main_thread = 0;  // Python's main thread: the one that runs signal handlers

// Signal handlers run only on the main thread, with the GIL: other threads never take it here.
void PythonInterruptCheck() {
  if (PyThread_get_thread_ident() != g_main_thread || !Py_IsInitialized() || _Py_IsFinalizing()) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  if (PyErr_CheckSignals() == 0) {
    PyGILState_Release(gil);
    return;
  }
  pyb::error_already_set e;  // takes the handler's exception (KeyboardInterrupt)
  PyGILState_Release(gil);
  throw e;
}

// ---- blocking waits ----
// Push waits for room in the engine's queue (backpressure) with the GIL held by the caller; a
// running task may need the GIL (a buffer NumPy owns freed on a worker, a cached Python object
// released), so the wait lets go of it. Nested regions release once; nothing is done during
// interpreter shutdown or on a thread that does not hold the GIL.
thread_local int t_blocking_depth = 0;
thread_local PyThreadState* t_released = nullptr;

void PythonBlockingHook(bool entering) {
  if (entering) {
    if (t_blocking_depth++ == 0 && Py_IsInitialized() && !_Py_IsFinalizing() && PyGILState_Check())
      t_released = PyEval_SaveThread();
    return;
  }
  if (--t_blocking_depth == 0 && t_released) {
    PyThreadState* ts = t_released;
    t_released = nullptr;
    PyEval_RestoreThread(ts);
  }
}

// ---- call sites ----
// Walking the stack and decoding a line number per op would cost more than the op, so the answer
// for a frame is cached by (code object, instruction offset): on a hit an op pays a few loads.
// The cache holds a reference to each code object it names, so that an address cannot be reused
// while an entry points at it. Everything here runs with the GIL held.
//
// On CPython 3.11 the walk reads the interpreter's own frame records: the public API would make a
// frame object for each of kiln's frames it steps over (a layer's forward, Block.__call__), an
// allocation per frame per op. Other versions use the public API.

std::string* g_package_dir = new std::string();  // kiln's own frames are not the user's
const char kInternal[] = "";                       // the site of a frame inside kiln

struct SiteEntry {
  PyCodeObject* code = nullptr;
  int offset = -1;
  const char* site = nullptr;
};
constexpr size_t kSiteSlots = 1024;
SiteEntry* g_sites = new SiteEntry[kSiteSlots];  // leaked: no Python calls after finalization
auto* g_interned = new std::unordered_set<std::string>();
constexpr size_t kMaxSites = 1 << 16;  // a program that generates code forever stops naming sites

// The site of the instruction at byte `offset` of `code`: kInternal inside kiln, nullptr unknown.
const char* Site(PyCodeObject* code, int offset) {
  size_t h = ((reinterpret_cast<uintptr_t>(code) >> 4) ^ (static_cast<size_t>(offset) * 0x9E3779B1u)) & (kSiteSlots - 1);
  SiteEntry& e = g_sites[h];
  if (e.code == code && e.offset == offset) return e.site;
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  if (!file) {
    PyErr_Clear();
    return nullptr;
  }
  const char* site = kInternal;
  if (g_package_dir->empty() || std::strncmp(file, g_package_dir->c_str(), g_package_dir->size()) != 0) {
    if (g_interned->size() >= kMaxSites) return nullptr;
    site = g_interned->insert(std::string(file) + ":" + std::to_string(PyCode_Addr2Line(code, offset))).first->c_str();
  }
  Py_INCREF(code);
  Py_XDECREF(e.code);
  e = {code, offset, site};
  return site;
}

}  // namespace

const char* PythonCallSite() {
  // This thread holds the GIL (PyGILState_Check without its shortcut for subinterpreters).
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (!ts || ts != _PyThreadState_UncheckedGet()) return nullptr;
  const char* site = nullptr;
#if KILN_PY_FRAMES_311
  int depth = 0;
  for (_PyInterpreterFrame* f = ts->cframe->current_frame; f && depth < 64;
       f = f->previous, ++depth) {
    if (_PyFrame_IsIncomplete(f)) continue;  // a frame still setting up: no instruction yet
    site = Site(f->f_code, _PyInterpreterFrame_LASTI(f) * static_cast<int>(sizeof(_Py_CODEUNIT)));
    if (site != kInternal) return site;
  }
  return nullptr;
#else
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  PyFrameObject* owned = nullptr;        // a frame PyFrame_GetBack gave us
  for (int depth = 0; f && depth < 64; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(f);
    site = Site(code, PyFrame_GetLasti(f));
    Py_DECREF(code);
    if (site != kInternal) break;
    site = nullptr;
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_XDECREF(owned);
    owned = f = back;
  }
  Py_XDECREF(owned);
  return site;
#endif
}

KILN_PY_BIND(70) {
  m.def("_install_hooks", [](const std::string& package_dir, unsigned long main_thread) {
    *g_package_dir = package_dir;
    g_main_thread = main_thread;
    SetInterruptCheck(&PythonInterruptCheck);
    SetBlockingHook(&PythonBlockingHook);
    SetCallSiteProvider(&PythonCallSite);
  }, pyb::arg("package_dir"), pyb::arg("main_thread"),
  "Lets Ctrl-C end the engine's waits, the engine's backpressure let go of the GIL, and engine errors name "
  "the user's call site (kiln/__init__.py).");
  m.def("_remove_hooks", [] {
    SetInterruptCheck(nullptr);
    SetBlockingHook(nullptr);
    SetCallSiteProvider(nullptr);
  }, "Undoes _install_hooks (at exit, before the interpreter goes away).");
  m.def("_call_site", [] {
    const char* s = PythonCallSite();
    return s ? pyb::object(pyb::str(s)) : pyb::object(pyb::none());
  }, "The call site an op queued here would name (for tests).");
}

}  // namespace kiln::py
