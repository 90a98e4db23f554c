/* A plain TCP echo over BSD sockets (socket, bind, listen, accept, connect, send, recv,
 * poll, shutdown, close), nothing of RDMA in it: run with librdmacm's librspreload.so
 * preloaded, its sockets are rsockets on the drop-in. `tcp_echo s ADDR PORT` echoes one
 * connection until its end; `tcp_echo c ADDR PORT BYTES` sends BYTES in pieces, reads them
 * back, checks them, and prints "tcp_echo: ok". */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: %s (errno %d)\n", __FILE__, __LINE__, #c, errno); exit(1); } } while (0)

int main(int argc, char **argv)
{
	struct sockaddr_in a;
	int one = 1;
	CHECK(argc >= 4);
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(atoi(argv[3]));
	inet_pton(AF_INET, argv[2], &a.sin_addr);
	if (argv[1][0] == 's') {
		int l = socket(AF_INET, SOCK_STREAM, 0), c;
		char buf[65536];
		long total = 0;
		CHECK(l >= 0);
		CHECK(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
		CHECK(bind(l, (struct sockaddr *) &a, sizeof a) == 0);
		CHECK(listen(l, 1) == 0);
		c = accept(l, NULL, NULL);
		CHECK(c >= 0);
		for (;;) {
			ssize_t n = recv(c, buf, sizeof buf, 0), put = 0;
			CHECK(n >= 0);
			if (n == 0)
				break;
			while (put < n) {
				ssize_t w = send(c, buf + put, n - put, 0);
				CHECK(w > 0);
				put += w;
			}
			total += n;
		}
		CHECK(close(c) == 0 && close(l) == 0);
		printf("tcp_echo: echoed %ld bytes\n", total);
		return 0;
	}
	long bytes = atol(argv[4]), sent = 0, got = 0, i;
	char *src = malloc(bytes), *dst = malloc(bytes);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	for (i = 0; i < bytes; i++)
		src[i] = (char) (i * 13 + i / 1000);
	CHECK(s >= 0);
	CHECK(connect(s, (struct sockaddr *) &a, sizeof a) == 0);
	while (got < bytes) {
		if (sent < bytes && sent - got < 32768) {
			ssize_t w = send(s, src + sent, bytes - sent < 8192 ? bytes - sent : 8192, 0);
			CHECK(w > 0);
			sent += w;
			continue;
		}
		struct pollfd p = { .fd = s, .events = POLLIN };
		CHECK(poll(&p, 1, 10000) == 1 && (p.revents & POLLIN));
		ssize_t n = recv(s, dst + got, bytes - got, 0);
		CHECK(n > 0);
		got += n;
	}
	CHECK(memcmp(src, dst, bytes) == 0);
	CHECK(shutdown(s, SHUT_WR) == 0);
	CHECK(close(s) == 0);
	printf("tcp_echo: ok\n");
	return 0;
}
