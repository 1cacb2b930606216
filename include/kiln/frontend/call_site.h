// Where the user queued an op, for the errors of engine tasks ("error in operator 'take' (called
// from train.py:42): ..."). SetCallSite (dispatch.h) names it for the ops that follow on a
// thread; a host language that knows its user's stack (the Python bindings) installs a provider
// that eager dispatch (and the optimizers' and collectives' tasks) ask for each op they queue
// instead. What it does not do: name the call site
// of ops that C++ code queues with no provider and no SetCallSite.
#pragma once

namespace kiln {

/// Returns the caller's call site ("file.py:12"), or nullptr when unknown. The string must live
/// for the rest of the process (tasks and stored errors keep the pointer). Must be cheap: it
/// runs for every eager op.
using CallSiteProvider = const char* (*)();

/// Installs `provider` for the whole process (nullptr removes it). SetCallSite wins over it.
void SetCallSiteProvider(CallSiteProvider provider);

/// The call site of the op about to be queued on this thread: SetCallSite's, else the provider's,
/// else nullptr (for engine::TaskOptions::call_site).
const char* CurrentCallSite();

}  // namespace kiln
