// Deterministic .tar.gz files (libarchive): the same files give the same
// bytes, whenever and by whomever they are written.
#ifndef COHORT_PROVISION_TARBALL_H_
#define COHORT_PROVISION_TARBALL_H_

#include <string>
#include <vector>

#include "common/status.h"

namespace cohort::provision {

// Writes `out` (mode 0600, replaced atomically) holding, under `prefix`/,
// each of `files` (paths relative to `root`, folders included as their own
// entries), in the order given. Entries keep their permission bits; owner
// and group are 0 without names, every time is 0, and the gzip header holds
// no time or name. Only regular files and folders; anything else is
// kInvalidArgument naming it.
Status WriteTarball(const std::string& root, const std::string& prefix,
                    const std::vector<std::string>& files, const std::string& out);

}  // namespace cohort::provision

#endif  // COHORT_PROVISION_TARBALL_H_
