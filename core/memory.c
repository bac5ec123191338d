/* What memory this process may still take, read before a command allocates
 * for a model: the machine's MemAvailable, the limit of the cgroup the
 * process runs in (cgroup v2 memory.max, less what the cgroup holds beyond
 * its reclaimable file cache), and the address-space limit (RLIMIT_AS, as
 * `prlimit --as` sets it) less the address space already in use. */
#include "mf_core.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* The number after `key` in a "key value" file (/proc/meminfo's kB lines are scaled), or -1. */
static int64_t read_key(const char *path, const char *key, int64_t scale) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    int64_t v = -1;
    const size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && (line[kl] == ' ' || line[kl] == ':' || line[kl] == '\t')) {
            v = strtoll(line + kl + 1, NULL, 10) * scale;
            break;
        }
    fclose(f);
    return v;
}

static int64_t read_number(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64] = "";
    const bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok || !strncmp(buf, "max", 3)) return -1;
    return strtoll(buf, NULL, 10);
}

/* This process's cgroup directory under /sys/fs/cgroup (v2), or "" */
static void cgroup_dir(char *dir, size_t n) {
    dir[0] = 0;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "0::", 3)) {
            line[strcspn(line, "\n")] = 0;
            snprintf(dir, n, "/sys/fs/cgroup%s", strcmp(line + 3, "/") ? line + 3 : "");
            break;
        }
    fclose(f);
}

void mf_mem_read_limits(mf_mem_limits *m) {
    m->ram = UINT64_MAX;
    m->ram_source = "no memory limit found";
    m->vm = UINT64_MAX;
    const int64_t avail = read_key("/proc/meminfo", "MemAvailable", 1024);
    if (avail >= 0) {
        m->ram = (uint64_t)avail;
        m->ram_source = "MemAvailable";
    }
    char dir[1200], path[1300];
    cgroup_dir(dir, sizeof dir);
    if (dir[0]) {
        snprintf(path, sizeof path, "%s/memory.max", dir);
        const int64_t max = read_number(path);
        snprintf(path, sizeof path, "%s/memory.current", dir);
        const int64_t cur = read_number(path);
        snprintf(path, sizeof path, "%s/memory.stat", dir);
        const int64_t file = read_key(path, "inactive_file", 1);
        if (max > 0 && cur >= 0) {
            int64_t left = max - cur + (file > 0 ? file : 0);
            if (left < 0) left = 0;
            if ((uint64_t)left < m->ram) {
                m->ram = (uint64_t)left;
                m->ram_source = "the cgroup's memory.max";
            }
        }
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        const int64_t used = read_key("/proc/self/status", "VmSize", 1024);
        const uint64_t lim = (uint64_t)rl.rlim_cur;
        m->vm = used >= 0 && (uint64_t)used < lim ? lim - (uint64_t)used : 0;
    }
}

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

int mf_mem_check(uint64_t need_ram, uint64_t need_vm, const char *what, mf_error *err) {
    mf_mem_limits m;
    mf_mem_read_limits(&m);
    if (need_ram > m.ram)
        return mf_fail(err, MF_ENOMEM, "%s needs %.2f GiB of memory, but %.2f GiB is available (%s)", what,
                       gib(need_ram), gib(m.ram), m.ram_source);
    if (need_vm > m.vm)
        return mf_fail(err, MF_ENOMEM, "%s needs %.2f GiB of address space, but the process may map %.2f GiB more "
                       "(RLIMIT_AS)", what, gib(need_vm), gib(m.vm));
    return MF_OK;
}
