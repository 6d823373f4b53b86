/*
 * clockshift: an LD_PRELOAD library that moves one process's wall clock, so a chaos run
 * can step the clock of one server while the machine's stays put.
 *
 * The offset, in seconds (a decimal, may be negative), is read from the file named by
 * CLOCKSHIFT_FILE, again at most every 100 ms of monotonic time. It shifts
 * CLOCK_REALTIME (and its coarse variant), gettimeofday() and time(); the monotonic
 * clocks are left alone, as when an operator or NTP steps a machine's clock.
 *
 * The real clocks are read with the raw system call, never through dlsym(): a server
 * linked with jemalloc can call clock_gettime() from inside dlsym(), which deadlocks or
 * recurses in a preload library that resolves the next symbol lazily.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_ns;
static long long next_read_ns;

static int real_clock_gettime(clockid_t clock, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, clock, ts);
}

static long long parse_offset_ns(const char *text) {
    return (long long)(strtod(text, NULL) * 1e9);
}

static void refresh_offset(void) {
    struct timespec now;
    if (real_clock_gettime(CLOCK_MONOTONIC, &now) != 0) {
        return;
    }
    long long now_ns = now.tv_sec * 1000000000LL + now.tv_nsec;
    if (now_ns < next_read_ns) {
        return;
    }
    next_read_ns = now_ns + 100000000LL;
    const char *path = getenv("CLOCKSHIFT_FILE");
    if (path == NULL) {
        return;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return;
    }
    char text[64];
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n > 0) {
        text[n] = '\0';
        offset_ns = parse_offset_ns(text);
    }
}

static void shift(struct timespec *ts) {
    long long ns = ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int rc = real_clock_gettime(clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        refresh_offset();
        shift(ts);
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
