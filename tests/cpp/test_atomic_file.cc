// kiln::WriteFileAtomic and WriteFilesAtomic (runtime/atomic_file.cc): rename semantics, kept
// permissions and links, the FileError of each failure with the old file intact and no temporary
// left, a full disk (RLIMIT_FSIZE in a forked child), writers killed at random instants, and the
// cleanup of what killed writers leave.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "kiln/runtime/atomic_file.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::ReadAll;
using testing::TempDir;
using testing::Contains;
using testing::ErrorOf;



// Runs `body` in a forked child and returns what it wrote to the pipe given to it; the child's
// exit status must be 0. Only the forking thread exists in the child: `body` must not use the
// engine.
template <class F>
std::string InChild(F&& body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    int rc = body(out);
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(rc);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "child failed: " << out);
  return out;
}

// In a child: the file size limit is `limit` bytes, and exceeding it fails write() with EFBIG
// instead of killing the process with SIGXFSZ (as with `ulimit -f` in a shell that ignores it).
void LimitFileSize(rlim_t limit) {
  ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit r;
  ::getrlimit(RLIMIT_FSIZE, &r);
  r.rlim_cur = limit;
  ::setrlimit(RLIMIT_FSIZE, &r);
}

TEST_CASE("atomic file: replaces the file by rename, and a reader of the old file keeps reading it") {
  TempDir dir("kiln_atomic");
  WriteFileAtomic(dir / "f", "old contents");
  std::ifstream reader(dir / "f", std::ios::binary); // opened before the replacement
  WriteFileAtomic(dir / "f", "new");
  CHECK(ReadAll(dir / "f") == "new");
  std::ostringstream os;
  os << reader.rdbuf();
  CHECK(os.str() == "old contents"); // a new file took the name; the old one was not rewritten in place
  CHECK(dir.Names() == std::vector<std::string>{"f"});
  WriteFileAtomic(dir / "empty", "");
  CHECK(fs::file_size(dir / "empty") == 0);
}

TEST_CASE("atomic file: a replaced file keeps its permissions and a symbolic link is followed") {
  TempDir dir("kiln_atomic");
  WriteFileAtomic(dir / "private", "secret 1");
  fs::permissions(dir / "private", fs::perms::owner_read | fs::perms::owner_write);
  WriteFileAtomic(dir / "private", "secret 2");
  CHECK(ReadAll(dir / "private") == "secret 2");
  CHECK(fs::status(dir / "private").permissions() == (fs::perms::owner_read | fs::perms::owner_write));

  WriteFileAtomic(dir / "epoch3.params", "three");
  fs::create_symlink("epoch3.params", dir / "latest.params");
  WriteFileAtomic(dir / "latest.params", "three, updated");
  CHECK(fs::is_symlink(dir / "latest.params"));
  CHECK(ReadAll(dir / "epoch3.params") == "three, updated");
  CHECK(dir.Names() == std::vector<std::string>{"epoch3.params", "latest.params", "private"});
}

TEST_CASE("atomic file: a missing directory or a directory in the way is a FileError, nothing changes") {
  TempDir dir("kiln_atomic");
  std::string msg = ErrorOf<FileError>([&] { WriteFileAtomic(dir / "missing/f", "x"); });
  CHECK(Contains(msg, "cannot write '" + dir / "missing/f" + "': creating a temporary file in '"));
  CHECK(Contains(msg, "No such file or directory; the directory '" + dir / "missing" +
                          "' does not exist: create it first. '" + dir / "missing/f" +
                          "' was not created and no temporary file was left"));
  CHECK(dir.Names().empty());

  fs::create_directories(dir / "target");
  std::ofstream(dir / "target/keep") << "kept";
  msg = ErrorOf<FormatError>([&] { WriteFileAtomic(dir / "target", "x"); }); // a FileError is a FormatError
  CHECK(Contains(msg, "onto it failed: Is a directory; '" + dir / "target" + "' is a directory: give the name of a file"));
  CHECK(dir.Names() == std::vector<std::string>{"target"});
  CHECK(ReadAll(dir / "target/keep") == "kept");
  CHECK_THROWS_AS(WriteFileAtomic(dir.path.string() + "/", "x"), ValueError);
  CHECK_THROWS_AS(WriteFilesAtomic({{dir / "a", "1"}, {dir / "a", "2"}}), ValueError);
  CHECK(dir.Names() == std::vector<std::string>{"target"});
}

TEST_CASE("atomic file: a full disk (RLIMIT_FSIZE, EFBIG) is a FileError naming the bytes, and the old file stays") {
  TempDir dir("kiln_atomic");
  WriteFileAtomic(dir / "f", "old");
  const std::string path = dir / "f";
  std::string msg = InChild([&](std::string& out) {
    LimitFileSize(4096);
    try {
      WriteFileAtomic(path, std::string(1 << 20, 'n'));
    } catch (const FileError& e) {
      out = e.what();
      return 0;
    }
    out = "no error";
    return 1;
  });
  CHECK(Contains(msg, "cannot write '" + path + "': writing 1048576 bytes to the temporary file '"));
  CHECK(Contains(msg, "(after 4096 bytes were written) failed: File too large; the file size limit was reached "
                      "(ulimit -f, RLIMIT_FSIZE): raise it, or save less. '" + path +
                          "' is unchanged and no temporary file was left"));
  CHECK(ReadAll(path) == "old");
  CHECK(dir.Names() == std::vector<std::string>{"f"});
}

TEST_CASE("atomic file: files written together: a failure while writing any of them changes none") {
  TempDir dir("kiln_atomic");
  WriteFilesAtomic({{dir / "net-symbol.json", "graph 1"}, {dir / "net-0000.params", "weights 1"}});
  const std::string sym = dir / "net-symbol.json", params = dir / "net-0000.params";
  std::string msg = InChild([&](std::string& out) {
    LimitFileSize(4096);
    try { // the first file fits, the second does not: the first must not be renamed either
      WriteFilesAtomic({{sym, "graph 2"}, {params, std::string(100000, 'w')}});
    } catch (const FileError& e) {
      out = e.what();
      return 0;
    }
    return 1;
  });
  CHECK(Contains(msg, "cannot write '" + params + "'"));
  CHECK(Contains(msg, "; none of '" + sym + "', '" + params + "' was changed"));
  CHECK(ReadAll(sym) == "graph 1");
  CHECK(ReadAll(params) == "weights 1");
  CHECK(dir.Names() == std::vector<std::string>{"net-0000.params", "net-symbol.json"});
  WriteFilesAtomic({{sym, "graph 2"}, {params, "weights 2"}});
  CHECK(ReadAll(sym) + ReadAll(params) == "graph 2weights 2");
}

TEST_CASE("atomic file: temporaries of killed writers are removed by the next write, live ones kept") {
  TempDir dir("kiln_atomic");
  const std::string path = dir / "net.params";
  pid_t dead = ::fork();
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead); // reaped: that pid names no process now
  pid_t alive = ::fork();
  REQUIRE(alive >= 0);
  if (alive == 0) {
    ::pause();
    ::_exit(0);
  }
  auto touch = [](const std::string& p) { std::ofstream(p) << "partial"; };
  const std::string stale = detail::TemporaryPath(path, dead, 3);
  const std::string live = detail::TemporaryPath(path, alive, 0);
  const std::string other = detail::TemporaryPath(dir / "other.params", dead, 0);
  touch(stale), touch(live), touch(other);
  CHECK(fs::path(stale).filename().string().rfind(".net.params.", 0) == 0);
  CHECK(fs::path(stale).filename().string().ends_with("-" + std::to_string(dead) + "-3.kiln.tmp"));

  WriteFileAtomic(path, "complete");
  CHECK(!fs::exists(stale));
  CHECK(fs::exists(live));  // its writer may still rename it
  CHECK(fs::exists(other)); // another file's: removed when that file is written
  CHECK(RemoveStaleTemporaries(dir / "other.params") == 1);
  ::kill(alive, SIGKILL);
  ::waitpid(alive, nullptr, 0);
  CHECK(RemoveStaleTemporaries(path) == 1);
  CHECK(dir.Names() == std::vector<std::string>{"net.params"});
  CHECK(ReadAll(path) == "complete");
}

TEST_CASE("atomic file: a writer killed at random instants leaves the old or the new file, whole") {
  TempDir dir("kiln_atomic");
  const std::string path = dir / "weights";
  // Two versions, distinguishable in every byte; large enough that a write takes a while.
  const std::string a(4 << 20, 'a'), b(4 << 20, 'b');
  WriteFileAtomic(path, a);
  std::mt19937 rng(17);
  int torn = 0, mid_write = 0;
  const int kills = 40;
  for (int i = 0; i < kills; ++i) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (int n = 0;; ++n) WriteFileAtomic(path, n % 2 ? a : b);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 30000)(rng)));
    ::kill(pid, SIGKILL);
    REQUIRE(::waitpid(pid, nullptr, 0) == pid);
    std::string now = ReadAll(path);
    torn += now != a && now != b;
    std::vector<std::string> names = dir.Names();
    mid_write += names.size() > 1;
    CHECK(names.size() <= 2); // the file and at most the temporary of the writer just killed
  }
  CHECK(torn == 0);
  MESSAGE(mid_write << " of " << kills << " kills interrupted a write");
  CHECK(mid_write > 0); // else the kills all missed the writes and proved nothing
  WriteFileAtomic(path, a);
  CHECK(dir.Names() == std::vector<std::string>{"weights"});
}

TEST_CASE("atomic file: concurrent writers of one file: the last rename wins, every version whole") {
  TempDir dir("kiln_atomic");
  const std::string path = dir / "shared";
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) WriteFileAtomic(path, std::string(100000, static_cast<char>('a' + t)));
    });
  for (auto& th : threads) th.join();
  std::string now = ReadAll(path);
  REQUIRE(now.size() == 100000);
  CHECK(std::count(now.begin(), now.end(), now[0]) == 100000);
  CHECK(dir.Names() == std::vector<std::string>{"shared"});
}

} // namespace
} // namespace kiln
