/*
 * fsyncfail: an LD_PRELOAD library that makes one process's fsync() and fdatasync() fail
 * with EIO while a file exists, so a chaos run can give one server a disk that stops
 * persisting (the AOF's background fsync fails) and then recovers.
 *
 * The file is named by FSYNCFAIL_FILE; while it exists every fsync() and fdatasync()
 * fails without syncing, and once it is gone they sync again. Like clockshift.c, it calls
 * the kernel with the raw system call and never resolves the next symbol with dlsym().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static int failing(void) {
    const char *path = getenv("FSYNCFAIL_FILE");
    return path != NULL && syscall(SYS_faccessat, AT_FDCWD, path, F_OK, 0) == 0;
}

int fsync(int fd) {
    if (failing()) {
        errno = EIO;
        return -1;
    }
    return (int)syscall(SYS_fsync, fd);
}

int fdatasync(int fd) {
    if (failing()) {
        errno = EIO;
        return -1;
    }
    return (int)syscall(SYS_fdatasync, fd);
}
