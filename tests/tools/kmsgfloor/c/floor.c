/* The floor of tests/tools/kmsgfloor in C: one thread blocking in read(2)
 * on /dev/kmsg, and the CPU it used per record from the first record to the
 * last (its schedstat). Start it before the writer (it reads from the end).
 *   cc -O2 -Wall -o floor floor.c && ./floor 2000 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void readstat(long long *cpu, long long *sw) {
	FILE *f = fopen("/proc/self/schedstat", "r");
	if (!f || fscanf(f, "%lld %*s %lld", cpu, sw) != 2) { perror("/proc/self/schedstat"); exit(1); }
	fclose(f);
}

int main(int argc, char **argv) {
	int n = argc > 1 ? atoi(argv[1]) : 2000;
	if (n < 2) { fprintf(stderr, "usage: floor [N >= 2]\n"); return 2; }
	int fd = open("/dev/kmsg", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || lseek(fd, 0, SEEK_END) < 0) { perror("/dev/kmsg"); return 1; }
	char b[8192];
	long long c0 = 0, s0 = 0, c, s;
	for (int i = 0; i < n; i++) {
		if (read(fd, b, sizeof b) < 0) {
			if (errno == EINTR || errno == EPIPE) { i--; continue; } /* EPIPE: overrun, once */
			perror("read"); return 1;
		}
		if (i == 0) readstat(&c0, &s0);
	}
	readstat(&c, &s);
	printf("c: %d records after the first, %.1f µs of CPU and %.2f switches-in per record\n",
	       n - 1, (c - c0) / 1e3 / (n - 1), (double)(s - s0) / (n - 1));
	return 0;
}
