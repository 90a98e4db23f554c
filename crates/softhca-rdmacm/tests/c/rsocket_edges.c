/* rsockets on the drop-in, in one process (the listener's connections are accepted by
 * librdmacm's service thread, so one thread can rconnect and then raccept): the refusals of
 * rsocket and of calls on a number that is no rsocket, options before and after the
 * connection, addresses of both ends, a message read with MSG_PEEK and in pieces, iovecs
 * both ways, 4 MiB through 64 KiB buffers (credits and buffer offers many times over), rpoll
 * and rselect, non-blocking calls (EAGAIN, a connect in progress), a half-close both ways, a
 * peer's close (end of stream, hang-up), and a connect nobody listens for
 * (ECONNREFUSED, SO_ERROR). Prints "rsocket_edges: ok". */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/uio.h>
#include <rdma/rsocket.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: %s (errno %d)\n", __FILE__, __LINE__, #c, errno); exit(1); } } while (0)

static struct sockaddr_in sin4(const char *ip, int port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

static int opt(int fd, int level, int name)
{
	int v = -1;
	socklen_t len = sizeof v;
	CHECK(rgetsockopt(fd, level, name, &v, &len) == 0 && len == sizeof v);
	return v;
}

/* Reads exactly n bytes (blocking). */
static void recv_all(int fd, char *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = rrecv(fd, buf + got, n - got, 0);
		if (r <= 0)
			fprintf(stderr, "rrecv(%d) after %zu of %zu bytes: %zd\n", fd, got, n, r);
		CHECK(r > 0);
		got += r;
	}
}

static void send_all(int fd, const char *buf, size_t n)
{
	size_t put = 0;
	while (put < n) {
		ssize_t r = rsend(fd, buf + put, n - put, 0);
		CHECK(r > 0);
		put += r;
	}
}

struct bulk {
	int fd;
	char *buf;
	size_t n;
};

static void *reader(void *arg)
{
	struct bulk *b = arg;
	recv_all(b->fd, b->buf, b->n);
	return NULL;
}

/* A listener on addr:port with 64 KiB buffers, and a connected pair (client, accepted). */
static void connect_pair(const char *addr, int port, int *l, int *c, int *s)
{
	struct sockaddr_in a = sin4(addr, port);
	int one = 1, buf = 32768;
	*l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(*l >= 0);
	CHECK(rsetsockopt(*l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
	CHECK(opt(*l, SOL_SOCKET, SO_REUSEADDR) == 1);
	CHECK(rsetsockopt(*l, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf) == 0);
	CHECK(rsetsockopt(*l, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf) == 0);
	CHECK(rbind(*l, (struct sockaddr *) &a, sizeof a) == 0);
	CHECK(rlisten(*l, 4) == 0);
	*c = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(*c >= 0);
	CHECK(rsetsockopt(*c, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf) == 0);
	CHECK(rsetsockopt(*c, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf) == 0);
	CHECK(rconnect(*c, (struct sockaddr *) &a, sizeof a) == 0);
	*s = raccept(*l, NULL, NULL);
	CHECK(*s >= 0);
}

int main(int argc, char **argv)
{
	const char *me = getenv("SOFTHCA_ADDR");
	char small[64], big[100];
	int l, c, s, v;
	CHECK(me);

	/* Refusals. */
	errno = 0;
	CHECK(rsocket(AF_UNIX, SOCK_STREAM, 0) == -1 && errno == ENOTSUP);
	CHECK(rsocket(AF_INET, SOCK_STREAM, IPPROTO_UDP) == -1 && errno == ENOTSUP);
	CHECK(rsocket(AF_INET, SOCK_DGRAM, 0) == -1 && errno == ENOSYS); /* not built */
	CHECK(rlisten(12345, 1) == -1 && errno == EBADF);
	CHECK(rsend(12345, "x", 1, 0) == -1 && errno == EBADF);
	CHECK(rclose(12345) == EBADF); /* librdmacm 44 returns it, without errno */

	/* Options before the connection. */
	c = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(c >= 0);
	v = 100;
	CHECK(rsetsockopt(c, SOL_SOCKET, SO_RCVBUF, &v, sizeof v) == 0);
	CHECK(opt(c, SOL_SOCKET, SO_RCVBUF) == 200);
	v = 10;
	CHECK(rsetsockopt(c, SOL_SOCKET, SO_SNDBUF, &v, sizeof v) == 0);
	CHECK(opt(c, SOL_SOCKET, SO_SNDBUF) == 4096); /* at least twice the low-water mark */
	v = 64;
	CHECK(rsetsockopt(c, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v) == 0 && opt(c, SOL_RDMA, RDMA_SQSIZE) == 64);
	CHECK(rsetsockopt(c, SOL_RDMA, RDMA_INLINE, &v, sizeof v) == 0 && opt(c, SOL_RDMA, RDMA_INLINE) == 64);
	v = 1;
	CHECK(rsetsockopt(c, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v) == 0 && opt(c, IPPROTO_TCP, TCP_NODELAY) == 1);
	v = 0;
	CHECK(rsetsockopt(c, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v) == 0 && opt(c, IPPROTO_TCP, TCP_NODELAY) == 0);
	CHECK(rsetsockopt(c, SOL_SOCKET, SO_PRIORITY, &v, sizeof v) == -1 && errno == ENOTSUP);
	CHECK(rfcntl(c, F_GETFL) == 0);
	CHECK(rfcntl(c, F_SETFL, O_NONBLOCK) == 0 && rfcntl(c, F_GETFL) == O_NONBLOCK);
	CHECK(rclose(c) == 0);

	/* A connect nobody listens for. */
	{
		struct sockaddr_in a = sin4(me, 7399);
		int err = -1;
		socklen_t len = sizeof err;
		c = rsocket(AF_INET, SOCK_STREAM, 0);
		CHECK(rconnect(c, (struct sockaddr *) &a, sizeof a) == -1 && errno == ECONNREFUSED);
		CHECK(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == ECONNREFUSED);
		CHECK(opt(c, SOL_SOCKET, SO_ERROR) == 0); /* read once */
		CHECK(rsend(c, "x", 1, 0) == -1 && errno == ECONNRESET); /* librdmacm's answer */
		CHECK(rclose(c) == 0);
	}

	connect_pair(me, 7400, &l, &c, &s);
	{
		struct sockaddr_in a;
		socklen_t len = sizeof a;
		CHECK(rgetpeername(c, (struct sockaddr *) &a, &len) == 0 && len == sizeof a);
		CHECK(ntohs(a.sin_port) == 7400 && a.sin_addr.s_addr == inet_addr(me));
		len = sizeof a;
		CHECK(rgetsockname(s, (struct sockaddr *) &a, &len) == 0 && ntohs(a.sin_port) == 7400);
		v = 16;
		CHECK(rsetsockopt(c, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v) == -1 && errno == EINVAL);
		CHECK(opt(c, SOL_SOCKET, SO_RCVBUF) == 65536);
	}

	/* Nothing to read yet: EAGAIN without blocking; rpoll says writable, not readable. */
	CHECK(rrecv(s, small, sizeof small, MSG_DONTWAIT) == -1 && errno == EAGAIN);
	{
		struct pollfd p[2] = { { .fd = c, .events = POLLIN | POLLOUT }, { .fd = s, .events = POLLIN } };
		CHECK(rpoll(p, 2, 0) == 1 && p[0].revents == POLLOUT && p[1].revents == 0);
	}

	/* A message, peeked and then read in pieces. */
	CHECK(rsend(c, "hello, rsocket", 14, 0) == 14);
	{
		struct pollfd p = { .fd = s, .events = POLLIN };
		CHECK(rpoll(&p, 1, 5000) == 1 && p.revents == POLLIN);
	}
	CHECK(rrecv(s, small, 5, MSG_PEEK) == 5 && memcmp(small, "hello", 5) == 0);
	CHECK(rrecv(s, small, 7, 0) == 7 && memcmp(small, "hello, ", 7) == 0);
	CHECK(rrecv(s, small, sizeof small, 0) == 7 && memcmp(small, "rsocket", 7) == 0);

	/* Iovecs: three out, read back through rrecvmsg (first iovec) and rreadv. */
	{
		struct iovec out[3] = { { "abc", 3 }, { "", 0 }, { "defgh", 5 } };
		struct iovec in = { big, 8 };
		struct msghdr m;
		memset(&m, 0, sizeof m);
		m.msg_iov = &in;
		m.msg_iovlen = 1;
		CHECK(rwritev(c, out, 3) == 8);
		CHECK(rrecvmsg(s, &m, MSG_WAITALL) == 8 && memcmp(big, "abcdefgh", 8) == 0);
		CHECK(rsendto(c, "x", 1, 0, (struct sockaddr *) &in, 1) == -1 && errno == EISCONN);
	}

	/* 4 MiB each way through 64 KiB receive buffers, checked byte by byte: a thread reads
	 * while this one writes. */
	{
		size_t n = 4 << 20, i;
		char *src = malloc(n), *dst = malloc(n);
		pthread_t t;
		for (i = 0; i < n; i++)
			src[i] = (char) (i * 7 + i / 4096);
		struct bulk b = { s, dst, n };
		CHECK(pthread_create(&t, NULL, reader, &b) == 0);
		send_all(c, src, n);
		CHECK(pthread_join(t, NULL) == 0);
		CHECK(memcmp(src, dst, n) == 0);
		memset(dst, 0, n);
		b.fd = c;
		CHECK(pthread_create(&t, NULL, reader, &b) == 0);
		send_all(s, src, n);
		CHECK(pthread_join(t, NULL) == 0);
		CHECK(memcmp(src, dst, n) == 0);
		free(src);
		free(dst);
	}

	/* rselect sees a readable socket. A reader gives its peer buffer space back when it next
	 * calls in (as with librdmacm): here a non-blocking rrecv, before the peer's send. */
	{
		fd_set r, w;
		struct timeval t = { 5, 0 };
		CHECK(rrecv(c, small, 1, MSG_DONTWAIT) == -1 && errno == EAGAIN);
		CHECK(rsend(s, "z", 1, 0) == 1);
		FD_ZERO(&r);
		FD_ZERO(&w);
		FD_SET(c, &r);
		CHECK(rselect(c + 1, &r, &w, NULL, &t) == 1 && FD_ISSET(c, &r));
		CHECK(rread(c, small, 1) == 1 && small[0] == 'z');
	}

	/* Half-close: the client stops writing; the server reads its data, then the end; it
	 * can still write to the client, which reads it. */
	CHECK(rsend(c, "last", 4, 0) == 4);
	CHECK(rshutdown(c, SHUT_WR) == 0);
	recv_all(s, small, 4);
	CHECK(memcmp(small, "last", 4) == 0);
	CHECK(rrecv(s, small, sizeof small, 0) == 0);
	CHECK(rsend(s, "back", 4, 0) == 4);
	recv_all(c, small, 4);
	CHECK(memcmp(small, "back", 4) == 0);
	CHECK(rclose(s) == 0);
	/* The peer closed: the end of the stream, and hang-up in rpoll. */
	CHECK(rrecv(c, small, sizeof small, 0) == 0);
	{
		struct pollfd p = { .fd = c, .events = POLLIN };
		CHECK(rpoll(&p, 1, 5000) == 1 && (p.revents & POLLHUP));
	}
	CHECK(rclose(c) == 0);

	/* A non-blocking connect: in progress, then writable; a non-blocking accept. */
	{
		struct sockaddr_in a = sin4(me, 7400);
		struct pollfd p;
		int err = -1, n = 0;
		socklen_t len = sizeof err;
		CHECK(rfcntl(l, F_SETFL, O_NONBLOCK) == 0);
		c = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		CHECK(c >= 0 && rfcntl(c, F_GETFL) == O_NONBLOCK);
		v = rconnect(c, (struct sockaddr *) &a, sizeof a);
		CHECK(v == 0 || errno == EINPROGRESS);
		p.fd = c;
		p.events = POLLOUT;
		CHECK(rpoll(&p, 1, 5000) == 1 && p.revents == POLLOUT);
		CHECK(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0);
		p.fd = l;
		p.events = POLLIN;
		CHECK(rpoll(&p, 1, 5000) == 1 && p.revents == POLLIN);
		s = raccept(l, NULL, NULL);
		CHECK(s >= 0);
		CHECK(raccept(l, NULL, NULL) == -1 && errno == EAGAIN);
		while ((v = rsend(c, "nb", 2, 0)) == -1 && errno == EAGAIN && n++ < 1000000)
			;
		CHECK(v == 2);
		CHECK(rfcntl(s, F_GETFL) == O_NONBLOCK); /* as its listener */
		p.fd = s;
		p.events = POLLIN;
		CHECK(rpoll(&p, 1, 5000) == 1 && p.revents == POLLIN);
		CHECK(rrecv(s, small, 2, 0) == 2);
		CHECK(memcmp(small, "nb", 2) == 0);
		CHECK(rclose(c) == 0 && rclose(s) == 0);
	}
	CHECK(rclose(l) == 0);
	(void) argc;
	(void) argv;
	printf("rsocket_edges: ok\n");
	return 0;
}
