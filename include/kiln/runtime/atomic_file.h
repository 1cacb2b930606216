// Files replaced whole or not at all: the one writer of every file kiln leaves for the user (params,
// exported graphs, the kernel cache, the profiler's trace, optimizer states). See
// runtime/atomic_file.cc for how, and what a kill at any instant leaves.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/runtime/error.h"

namespace kiln {

/// A file that cannot be written (missing directory, no permission, full disk, file size limit).
/// A FormatError, so code that caught a failed save as one still does; Python sees an OSError too.
/// Declared here, beside the one writer that throws it.
class FileError : public FormatError { using FormatError::FormatError; };

/// Writes `bytes` to a temporary file beside `path`, fsyncs it, renames it over `path` and fsyncs
/// the directory. A symbolic link at `path` is followed (the file it names is replaced); an
/// existing file keeps its permission bits. Throws FileError naming the file, the step that failed,
/// the bytes written and what to do; then `path` is unchanged and no temporary file remains.
/// Temporaries left by writers of `path` that were killed are removed first.
void WriteFileAtomic(const std::string& path, std::string_view bytes);

/// One file for WriteFilesAtomic: its path and its new contents (not owned).
struct FileContents {
  std::string path;
  std::string_view bytes;
};

/// Replaces several files that belong together (an exported graph and its parameters): every file
/// is written and fsynced to its temporary before the first rename, so a failure while writing (a
/// full disk) changes none of them. The renames follow the order given; a process killed between
/// two of them leaves the earlier files new and the later ones old. A rename that fails after
/// others succeeded throws FileError naming the files already replaced. A path that names no file
/// ("dir/") or one file given twice is a ValueError.
void WriteFilesAtomic(const std::vector<FileContents>& files);

/// Removes the temporary files beside `path` that writers of `path` on this host left when they
/// were killed (their process is gone); returns how many. Other temporaries are left alone.
int RemoveStaleTemporaries(const std::string& path);

namespace detail {
/// The name WriteFileAtomic gives to its `n`th temporary for `path` in process `pid`.
std::string TemporaryPath(const std::string& path, long pid, unsigned long long n);
} // namespace detail

} // namespace kiln
