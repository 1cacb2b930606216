// The user's call site (host_hooks.cc), for bindings that release the GIL before they queue work:
// the provider cannot look at Python's stack without the GIL, so they name it first.
#pragma once

#include "kiln/frontend/dispatch.h"

namespace kiln::py {

/// The innermost frame outside the kiln package, as "file.py:12"; nullptr without the GIL.
const char* PythonCallSite();

/// Names the caller's call site for the ops queued on this thread in its scope (SetCallSite);
/// made while the GIL is still held.
class CallSiteScope {
 public:
  CallSiteScope() { SetCallSite(PythonCallSite()); }
  ~CallSiteScope() { SetCallSite(nullptr); }
  CallSiteScope(const CallSiteScope&) = delete;
  CallSiteScope& operator=(const CallSiteScope&) = delete;
};

}  // namespace kiln::py
