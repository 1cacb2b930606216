// Atomic file replacement (kiln/runtime/atomic_file.h): every user-visible file kiln writes goes
// through here, so a reader, a concurrent writer, or a process killed at any instant (SIGKILL, an
// out-of-memory kill, power loss after the fsyncs) sees either the old file or the whole new one.
//
// How: the new contents go to a temporary file in the target's directory (so the rename cannot
// cross file systems), created with O_EXCL; every write(), the fsync() and the close() are
// checked (a full disk or a quota may only show at fsync or close); then rename() replaces the
// target in one step and the directory is fsynced so that the rename itself survives a crash.
// On any failure the temporary is removed and FileError says which file, which step, how many
// bytes had been written, and what to do; the target is untouched.
//
// Temporaries are named ".NAME.HOST-PID-N.kiln.tmp". A killed writer cannot remove its own, so
// the next write of NAME removes those whose process no longer exists on this host: they never
// accumulate, and a live writer's temporary (in this or another process) is never touched.
//
// Not here: the formats (ir/), and any locking between concurrent writers of one file (the last
// rename wins; every version is whole).
#include "kiln/runtime/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "kiln/runtime/error.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSuffix = ".kiln.tmp";
// NAME_MAX is 255 on Linux file systems: a long file name is shortened in its temporary's name.
constexpr size_t kMaxNameInTemporary = 160;

// The host's name as a file name part (letters, digits, '_'), so that a temporary left in a
// directory shared over the network is judged only by a writer on the host that made it.
const std::string& HostTag() {
  static const std::string tag = [] {
    char buf[256] = {};
    std::string t;
    if (::gethostname(buf, sizeof buf - 1) == 0)
      for (const char* c = buf; *c && t.size() < 32; ++c)
        t += std::isalnum(static_cast<unsigned char>(*c)) ? *c : '_';
    return t.empty() ? std::string("host") : t;
  }();
  return tag;
}

std::string TemporaryPrefix(const std::string& name) {
  return "." + name.substr(0, kMaxNameInTemporary) + "." + HostTag() + "-";
}

struct Target {
  std::string user_path; // as the caller named it, for messages
  fs::path file;         // the file that is replaced (a symbolic link followed)
  fs::path dir;
  std::string name;
  bool existed = false;
};

Target Resolve(const std::string& path) {
  Target t{path, fs::path(path), {}, {}, false};
  std::error_code ec;
  if (fs::is_symlink(t.file, ec)) {
    fs::path real = fs::canonical(t.file, ec);
    if (!ec) t.file = real; // a dangling link is replaced by the file
  }
  t.dir = t.file.parent_path().empty() ? fs::path(".") : t.file.parent_path();
  t.name = t.file.filename().string();
  struct stat st;
  t.existed = ::stat(t.file.c_str(), &st) == 0;
  return t;
}

std::string Hint(int err, const Target& t) {
  const std::string dir = "'" + t.dir.string() + "'";
  switch (err) {
    case ENOSPC: return "the file system of " + dir + " is full: free space there, or save to another directory";
    case EDQUOT: return "the disk quota is exhausted: free space, or save to another directory";
    case EFBIG:
      return "the file size limit was reached (ulimit -f, RLIMIT_FSIZE): raise it, or save less";
    case ENOENT: return "the directory " + dir + " does not exist: create it first";
    case EACCES:
    case EPERM: return "there is no permission to write in " + dir + ": choose a writable directory";
    case EROFS: return dir + " is on a read-only file system: save to another directory";
    case EISDIR: return "'" + t.user_path + "' is a directory: give the name of a file";
    case ENOTDIR: return "a part of " + dir + " is not a directory: check the path";
    default: return "check that " + dir + " exists, is writable and has space";
  }
}

// A temporary file: closed and removed when it goes out of scope unless renamed into place.
struct Temporary {
  int fd = -1;
  std::string path;
  bool renamed = false;
  Temporary() = default;
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;
  ~Temporary() {
    if (fd >= 0) ::close(fd);
    if (!path.empty() && !renamed) ::unlink(path.c_str());
  }
};

// `others`: what to add about the other files of a WriteFilesAtomic call.
[[noreturn]] void Fail(const Target& t, const std::string& step, int err, const std::string& others) {
  KILN_THROW(FileError) << "cannot write '" << t.user_path << "': " << step << " failed: " << std::strerror(err)
                        << "; " << Hint(err, t) << ". '" << t.user_path << "' "
                        << (t.existed ? "is unchanged" : "was not created") << " and no temporary file was left"
                        << others;
}

int RemoveStale(const Target& t) {
  const std::string prefix = TemporaryPrefix(t.name);
  const long self = static_cast<long>(::getpid());
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(t.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() + kSuffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        !name.ends_with(kSuffix))
      continue;
    std::string_view rest(name);
    rest = rest.substr(prefix.size(), rest.size() - prefix.size() - kSuffix.size()); // "PID-N"
    size_t dash = rest.find('-');
    auto digits = [](std::string_view s) {
      return !s.empty() && s.size() < 19 &&
             std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (dash == std::string_view::npos || !digits(rest.substr(0, dash)) || !digits(rest.substr(dash + 1)))
      continue;
    long pid = std::stol(std::string(rest.substr(0, dash)));
    if (pid <= 0 || pid == self) continue;
    // ESRCH only: EPERM means the process exists (another user's), so its file is left alone.
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (::unlink(it->path().c_str()) == 0) ++removed;
  }
  return removed;
}

void WriteTemporary(const Target& t, std::string_view bytes, Temporary& tmp, const std::string& others) {
  RemoveStale(t); // first: on a full disk, what killed writers left may be the missing space
  static std::atomic<unsigned long long> counter{0};
  for (int attempt = 0; attempt < 100 && tmp.fd < 0; ++attempt) {
    tmp.path = detail::TemporaryPath(t.file.string(), static_cast<long>(::getpid()), counter++);
    tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (tmp.fd < 0 && errno != EEXIST) break;
  }
  if (tmp.fd < 0) {
    int err = errno;
    tmp.path.clear();
    Fail(t, "creating a temporary file in '" + t.dir.string() + "'", err, others);
  }
  // 0666 lets the umask decide a new file's mode; a replaced file keeps its own (a private 0600
  // file stays private). Set before any byte is written.
  struct stat st;
  if (::stat(t.file.c_str(), &st) == 0 && S_ISREG(st.st_mode)) (void)::fchmod(tmp.fd, st.st_mode & 07777);

  const char* p = bytes.data();
  size_t written = 0;
  while (written < bytes.size()) {
    ssize_t n = ::write(tmp.fd, p + written, std::min<size_t>(bytes.size() - written, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      Fail(t,
           "writing " + std::to_string(bytes.size()) + " bytes to the temporary file '" + tmp.path + "' (after " +
               std::to_string(written) + " bytes were written)",
           err, others);
    }
    written += static_cast<size_t>(n);
  }
  const std::string all = std::to_string(bytes.size()) + " bytes written to '" + tmp.path + "'";
  if (::fsync(tmp.fd) != 0) Fail(t, "flushing (fsync) the " + all, errno, others);
  int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) Fail(t, "closing the temporary file after " + all, errno, others);
}

void SyncDirectory(const fs::path& dir) {
  // Makes the rename durable; a failure here still leaves a complete file, so it is not an error.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

} // namespace

namespace detail {
std::string TemporaryPath(const std::string& path, long pid, unsigned long long n) {
  fs::path file(path);
  fs::path dir = file.parent_path();
  std::string name = TemporaryPrefix(file.filename().string()) + std::to_string(pid) + "-" + std::to_string(n) +
                     std::string(kSuffix);
  return (dir.empty() ? fs::path(name) : dir / name).string();
}
} // namespace detail

void WriteFilesAtomic(const std::vector<FileContents>& files) {
  std::vector<Target> targets;
  for (const FileContents& f : files) {
    targets.push_back(Resolve(f.path));
    if (targets.back().name.empty() || targets.back().name == "." || targets.back().name == "..")
      KILN_THROW(ValueError) << "cannot write '" << f.path << "': expected the name of a file, got a directory";
    for (size_t i = 0; i + 1 < targets.size(); ++i)
      if (targets[i].file == targets.back().file)
        KILN_THROW(ValueError) << "cannot write '" << f.path << "' twice in one atomic write (also given as '"
                               << files[i].path << "')";
  }
  auto names = [&](size_t from, size_t to) {
    std::string s;
    for (size_t i = from; i < to; ++i) s += (i > from ? ", '" : "'") + files[i].path + "'";
    return s;
  };
  const std::string none_changed = files.size() > 1 ? "; none of " + names(0, files.size()) + " was changed" : "";

  std::unique_ptr<Temporary[]> temps(new Temporary[files.size()]);
  for (size_t i = 0; i < files.size(); ++i) WriteTemporary(targets[i], files[i].bytes, temps[i], none_changed);
  for (size_t i = 0; i < files.size(); ++i) {
    if (::rename(temps[i].path.c_str(), targets[i].file.c_str()) != 0) {
      int err = errno;
      std::string others = i == 0 ? none_changed
                                  : "; " + names(0, i) + " already replaced by the new version" +
                                        (i + 1 < files.size() ? ", " + names(i + 1, files.size()) + " unchanged" : "") +
                                        ": write them all again";
      Fail(targets[i], "renaming '" + temps[i].path + "' onto it", err, others);
    }
    temps[i].renamed = true;
  }
  for (size_t i = 0; i < files.size(); ++i) {
    bool seen = false;
    for (size_t j = 0; j < i; ++j) seen = seen || targets[j].dir == targets[i].dir;
    if (!seen) SyncDirectory(targets[i].dir);
  }
}

void WriteFileAtomic(const std::string& path, std::string_view bytes) { WriteFilesAtomic({{path, bytes}}); }

int RemoveStaleTemporaries(const std::string& path) { return RemoveStale(Resolve(path)); }

} // namespace kiln
