#include "provision/tarball.h"

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

namespace cohort::provision {
namespace {

struct ArchiveDeleter {
  void operator()(archive* a) const { archive_write_free(a); }
};
struct EntryDeleter {
  void operator()(archive_entry* e) const { archive_entry_free(e); }
};
using Archive = std::unique_ptr<archive, ArchiveDeleter>;
using Entry = std::unique_ptr<archive_entry, EntryDeleter>;

Status ArchiveError(archive* a, const std::string& what) {
  const char* why = archive_error_string(a);
  return UnavailableError(what + ": " + (why ? why : "libarchive failed"));
}

// ustar where it fits, pax headers only for what ustar cannot hold; gzip
// without the time and name that would make two runs differ.
StatusOr<Archive> OpenArchive(const std::string& path) {
  Archive a(archive_write_new());
  if (!a) return InternalError("archive_write_new failed");
  if (archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK ||
      archive_write_add_filter_gzip(a.get()) != ARCHIVE_OK ||
      archive_write_set_filter_option(a.get(), "gzip", "timestamp", nullptr) != ARCHIVE_OK ||
      archive_write_open_filename(a.get(), path.c_str()) != ARCHIVE_OK) {
    return ArchiveError(a.get(), path);
  }
  return a;
}

Status AddEntry(archive* a, const std::filesystem::path& source, const std::string& name) {
  struct stat st = {};
  if (::lstat(source.c_str(), &st) != 0) return NotFoundError(source.string() + ": cannot stat");
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    return InvalidArgumentError(source.string() + ": not a regular file or a folder");
  }
  std::string bytes;
  if (S_ISREG(st.st_mode)) {
    std::ifstream in(source, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) return UnavailableError(source.string() + ": cannot read");
    bytes = text.str();
  }
  Entry e(archive_entry_new());
  archive_entry_set_pathname(e.get(), name.c_str());
  archive_entry_set_filetype(e.get(), S_ISDIR(st.st_mode) ? AE_IFDIR : AE_IFREG);
  archive_entry_set_perm(e.get(), st.st_mode & 07777);
  archive_entry_set_size(e.get(), static_cast<la_int64_t>(bytes.size()));
  archive_entry_set_uid(e.get(), 0);
  archive_entry_set_gid(e.get(), 0);
  archive_entry_set_mtime(e.get(), 0, 0);
  if (archive_write_header(a, e.get()) != ARCHIVE_OK) return ArchiveError(a, name);
  if (!bytes.empty() &&
      archive_write_data(a, bytes.data(), bytes.size()) != static_cast<la_ssize_t>(bytes.size())) {
    return ArchiveError(a, name);
  }
  return OkStatus();
}

}  // namespace

Status WriteTarball(const std::string& root, const std::string& prefix,
                    const std::vector<std::string>& files, const std::string& out) {
  const std::string tmp = out + ".tmp";
  std::remove(tmp.c_str());
  {
    // Created 0600 before libarchive opens it: a kit's tarball holds its key.
    std::ofstream create(tmp, std::ios::trunc);
    if (!create || ::chmod(tmp.c_str(), 0600) != 0) {
      return UnavailableError(tmp + ": cannot create");
    }
  }
  COHORT_ASSIGN_OR_RETURN(Archive a, OpenArchive(tmp));
  Status st = AddEntry(a.get(), root, prefix);
  for (size_t i = 0; st.ok() && i < files.size(); ++i) {
    st = AddEntry(a.get(), std::filesystem::path(root) / files[i], prefix + "/" + files[i]);
  }
  if (st.ok() && archive_write_close(a.get()) != ARCHIVE_OK) st = ArchiveError(a.get(), out);
  a.reset();
  std::error_code ec;
  if (st.ok()) std::filesystem::rename(tmp, out, ec);
  if (!st.ok() || ec) {
    std::remove(tmp.c_str());
    return st.ok() ? UnavailableError(out + ": " + ec.message()) : st;
  }
  return OkStatus();
}

}  // namespace cohort::provision
