// common/guard.c — the output guard of common/io.h: the run's inputs, the outputs checked, exclusive final
// renames, stale temporaries, and the removal of temporaries on SIGINT / SIGTERM.
#include "common/io.h"
#include "common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0) // linux/fs.h
#endif

// ---- the run's inputs (device, inode): recorded only in a run of the executable (llmq_guard_begin_run), so
// that library users and tests may rewrite a file they read
// -----------------------------------------------------------------------

struct file_id {
    dev_t dev;
    ino_t ino;
};

static struct file_id *inputs; // (n_inputs) every input recorded so far
static size_t n_inputs, cap_inputs;
static bool recording; // llmq_guard_begin_run was called: a command of the llmq executable

static void add_id(dev_t dev, ino_t ino) {
    if (!recording) return;
    for (size_t i = 0; i < n_inputs; i++)
        if (inputs[i].dev == dev && inputs[i].ino == ino) return;
    if (n_inputs == cap_inputs) {
        size_t nc = cap_inputs ? cap_inputs * 2 : 64;
        struct file_id *ni = realloc(inputs, nc * sizeof(*ni));
        if (!ni) return; // best effort: the commit-time check still compares with `in`
        inputs = ni;
        cap_inputs = nc;
    }
    inputs[n_inputs++] = (struct file_id){dev, ino};
}

void llmq_input_add_fd(int fd) {
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0) add_id(st.st_dev, st.st_ino);
}

void llmq_input_add(const char *path) {
    struct stat st;
    if (!path || stat(path, &st) != 0) return;
    add_id(st.st_dev, st.st_ino);
    if (!S_ISDIR(st.st_mode)) return;
    DIR *d = opendir(path); // a model directory: its shards, config and tokenizer files are inputs too
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char *p = llmq_path_join(path, e->d_name);
        if (p && strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && stat(p, &st) == 0 && S_ISREG(st.st_mode))
            add_id(st.st_dev, st.st_ino);
        free(p);
    }
    if (d) closedir(d);
}

void llmq_input_forget(const char *path) {
    struct stat st;
    if (!path || stat(path, &st) != 0) return;
    for (size_t i = 0; i < n_inputs;)
        if (inputs[i].dev == st.st_dev && inputs[i].ino == st.st_ino)
            inputs[i] = inputs[--n_inputs];
        else
            i++;
}

static bool is_input_stat(const struct stat *st) {
    for (size_t i = 0; i < n_inputs; i++)
        if (inputs[i].dev == st->st_dev && inputs[i].ino == st->st_ino) return true;
    return false;
}

// Whether path (followed) is an input of the run, or a directory holding one directly.
static bool path_is_input(const char *path, bool dir) {
    struct stat st;
    if (stat(path, &st) != 0) return false;
    if (is_input_stat(&st)) return true;
    if (!dir || !S_ISDIR(st.st_mode)) return false;
    DIR *d = opendir(path);
    struct dirent *e;
    bool found = false;
    while (d && !found && (e = readdir(d))) {
        char *p = llmq_path_join(path, e->d_name);
        found = p && strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && stat(p, &st) == 0 && is_input_stat(&st);
        free(p);
    }
    if (d) closedir(d);
    return found;
}

// ---- outputs checked: which may replace an existing file --------------------------------------------------

#define MAX_OUTPUTS 64
static struct {
    char *path;
    bool force;
} outputs[MAX_OUTPUTS];
static int n_outputs;

static void record_output(const char *out, bool force) {
    for (int i = 0; i < n_outputs; i++)
        if (strcmp(outputs[i].path, out) == 0) {
            outputs[i].force = force;
            return;
        }
    if (n_outputs < MAX_OUTPUTS && (outputs[n_outputs].path = strdup(out))) outputs[n_outputs++].force = force;
}

// -1: out was never checked (plain rename), 0: checked without force (exclusive), 1: with force (replace).
static int output_policy(const char *out) {
    for (int i = 0; i < n_outputs; i++)
        if (strcmp(outputs[i].path, out) == 0) return outputs[i].force;
    return -1;
}

// ---- temporaries: the list the signal handler removes ----------------------------------------------------

#define MAX_TEMPS 64
static struct {
    atomic_int state; // 0 free, 1 being written, 2 a file, 3 a directory
    char path[PATH_MAX];
} temps[MAX_TEMPS];

void llmq_temp_register(const char *path, bool dir) {
    size_t n = strlen(path);
    if (n >= PATH_MAX) return;
    for (int i = 0; i < MAX_TEMPS; i++) {
        int expect = 0;
        if (atomic_compare_exchange_strong(&temps[i].state, &expect, 1)) {
            memcpy(temps[i].path, path, n + 1);
            atomic_store(&temps[i].state, dir ? 3 : 2);
            return;
        }
    }
}

void llmq_temp_unregister(const char *path) {
    for (int i = 0; i < MAX_TEMPS; i++) {
        int s = atomic_load(&temps[i].state);
        if (s >= 2 && strcmp(temps[i].path, path) == 0) {
            atomic_store(&temps[i].state, 0);
            return;
        }
    }
}

// Removes the directory path and what it holds (two levels: llmq's staged directories are flat) with
// async-signal-safe calls only (open, getdents64, unlinkat, close): no malloc, no stdio.
static void rmdir_signal_safe(int parent, const char *name, int depth) {
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        char buf[4096];
        long n;
        while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
            for (long off = 0; off < n;) {
                // struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, char name[]
                unsigned short reclen;
                memcpy(&reclen, buf + off + 16, sizeof reclen);
                const char *nm = buf + off + 19;
                if (strcmp(nm, ".") && strcmp(nm, "..") && unlinkat(fd, nm, 0) != 0 && depth > 0)
                    rmdir_signal_safe(fd, nm, depth - 1);
                off += reclen;
            }
        }
        close(fd);
    }
    unlinkat(parent, name, AT_REMOVEDIR);
}

static void remove_temps_signal_safe(void) {
    for (int i = 0; i < MAX_TEMPS; i++) {
        int s = atomic_load(&temps[i].state);
        if (s == 2) unlink(temps[i].path);
    }
    for (int i = 0; i < MAX_TEMPS; i++) // directories after the files (a shard's temp lies inside one)
        if (atomic_load(&temps[i].state) == 3) rmdir_signal_safe(AT_FDCWD, temps[i].path, 2);
}

// The note printed after the handler's line: two buffers, the one in use published atomically, so that a
// signal arriving while the other is rewritten reads a whole line.
static char notes[2][1024];
static atomic_int note_at = -1; // index of the published note, -1: none

void llmq_guard_set_note(const char *line) {
    if (!line) {
        atomic_store(&note_at, -1);
        return;
    }
    int i = atomic_load(&note_at) == 0 ? 1 : 0;
    snprintf(notes[i], sizeof notes[i], "%s", line);
    atomic_store(&note_at, i);
}

static void on_signal(int sig) {
    static atomic_flag once = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&once)) return; // another thread is already on its way out
    remove_temps_signal_safe();
    const char *msg = sig == SIGINT ? "llmq: interrupted (SIGINT): temporary outputs removed"
                                    : "llmq: terminated (SIGTERM): temporary outputs removed";
    int at = atomic_load(&note_at);
    ssize_t w = write(STDERR_FILENO, msg, strlen(msg));
    if (at >= 0) { // one line: what was kept and how to continue
        w = write(STDERR_FILENO, "; ", 2);
        w = write(STDERR_FILENO, notes[at], strlen(notes[at]));
    } else {
        w = write(STDERR_FILENO, ", nothing written", 17);
    }
    w = write(STDERR_FILENO, "\n", 1);
    (void)w;
    _exit(128 + sig);
}

void llmq_guard_begin_run(void) {
    recording = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

// ---- stale temporaries of dead processes -------------------------------------------------------------------

// Removes "<out>.tmp.<pid>" and "<out>.old.<pid>" next to out whose pid is ours (a leftover) or names no
// live process (kill(pid, 0) fails with ESRCH): what a crash, kill -9 or power loss left.
static void remove_stale(const char *out) {
    char *copy = strdup(out);
    if (!copy) return;
    char *slash = strrchr(copy, '/');
    const char *dir = ".", *base = copy;
    if (slash) {
        *slash = '\0';
        dir = slash == copy ? "/" : copy;
        base = slash + 1;
    }
    size_t bl = strlen(base);
    DIR *d = bl ? opendir(dir) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *nm = e->d_name;
        if (strncmp(nm, base, bl) != 0 || (strncmp(nm + bl, ".tmp.", 5) && strncmp(nm + bl, ".old.", 5))) continue;
        const char *digits = nm + bl + 5;
        char *end = NULL;
        errno = 0;
        long pid = strtol(digits, &end, 10);
        if (end == digits || *end || errno || pid <= 0 || pid > INT_MAX) continue;
        bool dead = pid == (long)getpid() || (kill((pid_t)pid, 0) != 0 && errno == ESRCH);
        if (!dead) continue;
        char *p = slash ? llmq_path_join(dir, nm) : strdup(nm);
        if (p) {
            llmq_remove_tree(p);
            llmq_info("%s: removed %s, left by process %ld, which no longer runs", out, p, pid);
        }
        free(p);
    }
    if (d) closedir(d);
    free(copy);
}

// ---- the check -------------------------------------------------------------------------------------------

static bool dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    struct dirent *e;
    bool empty = d != NULL;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
    if (d) closedir(d);
    return empty;
}

enum llmq_status llmq_output_check(const char *in, const char *out, bool dir, bool force, bool *exists) {
    struct stat so;
    *exists = false;
    llmq_input_add(in);
    remove_stale(out);
    if (lstat(out, &so) != 0) {
        if (errno != ENOENT) return llmq_errorf(LLMQ_ERR_IO, "%s: %s", out, strerror(errno));
        record_output(out, force); // a new path: created exclusively unless --force
        return LLMQ_OK;
    }
    *exists = true;
    struct stat si;
    if (path_is_input(out, dir) || (in && stat(in, &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: the output is an input of this run%s: not overwritten, even with --force",
                           out, dir ? " (or holds one)" : "");
    if (!force) return llmq_errorf(LLMQ_ERR_ARG, "%s: exists (use --force to replace it)", out);
    if (!dir && !S_ISREG(so.st_mode))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: exists and is not a regular file: not replaced, even with --force", out);
    if (dir) {
        char *mark = llmq_path_join(out, LLMQ_OUTDIR_MARKER);
        bool ok = S_ISDIR(so.st_mode) && mark && (llmq_file_exists(mark) || dir_is_empty(out));
        free(mark);
        if (!ok)
            return llmq_errorf(LLMQ_ERR_ARG,
                               "%s: exists and is neither a directory llmq wrote (it has no %s) nor empty: not "
                               "replaced, even with --force",
                               out, LLMQ_OUTDIR_MARKER);
    }
    record_output(out, true);
    return LLMQ_OK;
}

enum llmq_status llmq_output_check_file(const char *out, bool force) {
    bool exists;
    return llmq_output_check(NULL, out, false, force, &exists);
}

// ---- the final rename ------------------------------------------------------------------------------------

// rename(2) that fails with EEXIST when dst exists: renameat2(RENAME_NOREPLACE); where the file system does
// not have it, link(2) + unlink (files), else a check and rename (directories: not atomic, logged).
static int rename_noreplace(const char *src, const char *dst, bool dir) {
    if (syscall(SYS_renameat2, AT_FDCWD, src, AT_FDCWD, dst, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1;
    if (!dir) {
        if (link(src, dst) == 0) return unlink(src), 0;
        if (errno == EEXIST) return -1;
    }
    struct stat st;
    if (lstat(dst, &st) == 0) return errno = EEXIST, -1;
    llmq_debug("%s: the file system has no exclusive rename; renamed after a check", dst);
    return rename(src, dst);
}

enum llmq_status llmq_output_rename(const char *tmp, const char *out, bool dir) {
    if (path_is_input(out, dir))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: the output is an input of this run: not overwritten, even with --force",
                           out);
    // a directory is always renamed onto a free path (a replaced one was moved aside); a file checked
    // without --force exclusively; a file checked with --force, or never checked, by rename(2)
    bool excl = dir || output_policy(out) == 0;
    if (excl ? rename_noreplace(tmp, out, dir) : rename(tmp, out)) {
        int e = errno;
        if (excl && (e == EEXIST || e == ENOTEMPTY))
            return llmq_errorf(LLMQ_ERR_IO,
                               "%s: appeared while this run was writing it (another process?): not replaced "
                               "(use --force to replace it)",
                               out);
        return llmq_errorf(LLMQ_ERR_IO, "%s: cannot rename %s into place: %s", out, tmp, strerror(e));
    }
    return LLMQ_OK;
}

// ---- output directories ---------------------------------------------------------------------------------

enum llmq_status llmq_outdir_create(const char *out, char **tmp) {
    *tmp = NULL;
    size_t tl = strlen(out) + 32;
    char *t = malloc(tl), *mark = NULL;
    if (!t) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", out);
    snprintf(t, tl, "%s.tmp.%ld", out, (long)getpid());
    remove_stale(out);
    if (mkdir(t, 0755) != 0) {
        enum llmq_status st = llmq_errorf(LLMQ_ERR_IO, "%s: cannot create: %s", t, strerror(errno));
        free(t);
        return st;
    }
    llmq_temp_register(t, true);
    static const char text[] = "This directory was written by llmq; `llmq ... --force` may replace it.\n";
    struct llmq_afile f;
    enum llmq_status st = (mark = llmq_path_join(t, LLMQ_OUTDIR_MARKER)) ? llmq_afile_open(&f, mark) : LLMQ_ERR_NOMEM;
    if (!st && !(st = llmq_afile_write(&f, text, sizeof text - 1)))
        st = llmq_afile_commit(&f);
    else if (!st)
        llmq_afile_abort(&f);
    free(mark);
    if (st) {
        llmq_outdir_discard(t);
        free(t);
        return st == LLMQ_ERR_NOMEM ? llmq_errorf(st, "%s: out of memory", out) : st;
    }
    *tmp = t;
    return LLMQ_OK;
}

void llmq_outdir_discard(const char *tmp) {
    if (!tmp) return;
    llmq_remove_tree(tmp);
    llmq_temp_unregister(tmp);
}

enum llmq_status llmq_outdir_publish(const char *tmp, const char *out, bool replace) {
    size_t n = strlen(out) + 32;
    char *old = malloc(n);
    enum llmq_status st = LLMQ_OK;
    if (!old) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", out);
    snprintf(old, n, "%s.old.%ld", out, (long)getpid());
    if (replace && path_is_input(out, true)) {
        st = llmq_errorf(LLMQ_ERR_ARG, "%s: the output is an input of this run (or holds one): not replaced", out);
        goto done;
    }
    if (replace && rename(out, old) != 0) {
        st = llmq_errorf(LLMQ_ERR_IO, "%s: cannot move aside: %s", out, strerror(errno));
        goto done;
    }
    if ((st = llmq_output_rename(tmp, out, true))) {
        if (replace) rename(old, out);
        goto done;
    }
    llmq_temp_unregister(tmp);
    if (replace) llmq_remove_tree(old);
    llmq_fsync_dir_of(out);
done:
    free(old);
    return st;
}
