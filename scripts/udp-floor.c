/* The kernel's floor for softhca's UDP ping-pong pattern: two processes on loopback bounce a
 * datagram, busy-polling, first with plain send()/recv() (what ../shared/tools/udp-baseline's
 * ping-pong does), then with the system calls softhca's link makes for an 8-byte RC Send and
 * its ACK: a sendmmsg of one GSO message of two segments (52 + 48 bytes: the answer and the
 * ACK), and a recvmmsg of up to 64 (or 1) messages with UDP_GRO and room for control messages;
 * and the cheapest calls found for those two datagrams (one sendmsg with GSO, one recvmsg with
 * GRO: two send()s, or a sendmmsg of two messages, cost more). No protocol and no checksum:
 * only the system calls. Usage, see scripts/udp-floor. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* pattern 0: send/recv, one 52-byte datagram a hop.
 * pattern 1: sendmmsg (one 52-byte datagram) + recvmmsg of 64 with GRO.
 * pattern 2: sendmmsg (GSO: 52 + 48 bytes) + recvmmsg of 64 with GRO (softhca under load).
 * pattern 3: pattern 2 with recvmmsg of 1 (softhca once a receive found a lone datagram).
 * pattern 4: sendmsg (GSO: 52 + 48 bytes) + recvmsg with GRO: the floor for RC's two. */
int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: udp-floor server|client PATTERN ITERS PORT\n");
    return 2;
  }
  int server = !strcmp(argv[1], "server"), pattern = atoi(argv[2]);
  long iters = atol(argv[3]);
  int base = atoi(argv[4]);
  int port = server ? base : base + 1, peer = server ? base + 1 : base;
  int s = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct sockaddr_in p = {.sin_family = AF_INET, .sin_port = htons(peer)};
  p.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(s, (void *)&a, sizeof a) || connect(s, (void *)&p, sizeof p)) {
    perror("bind/connect");
    return 1;
  }
  int one = 1;
  if (pattern && setsockopt(s, SOL_UDP, UDP_GRO, &one, sizeof one)) {
    perror("UDP_GRO");
    return 1;
  }
  static char tx[128], rx[64][9000], ctl[64][64];
  memset(tx, 1, sizeof tx);
  struct mmsghdr rm[64];
  struct iovec ri[64];
  for (int i = 0; i < 64; i++) {
    ri[i].iov_base = rx[i];
    ri[i].iov_len = sizeof rx[i];
    memset(&rm[i], 0, sizeof rm[i]);
    rm[i].msg_hdr.msg_iov = &ri[i];
    rm[i].msg_hdr.msg_iovlen = 1;
  }
  int gso = pattern >= 2, vlen = pattern == 3 ? 1 : 64, single = pattern == 4;
  struct mmsghdr sm;
  struct iovec si[2] = {{tx, 52}, {tx + 52, 48}};
  char sctl[CMSG_SPACE(sizeof(uint16_t))];
  memset(&sm, 0, sizeof sm);
  sm.msg_hdr.msg_iov = si;
  sm.msg_hdr.msg_iovlen = gso ? 2 : 1;
  if (gso) {
    sm.msg_hdr.msg_control = sctl;
    sm.msg_hdr.msg_controllen = sizeof sctl;
    struct cmsghdr *c = CMSG_FIRSTHDR(&sm.msg_hdr);
    c->cmsg_level = SOL_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    *(uint16_t *)CMSG_DATA(c) = 52;
  }
  double *lat = malloc(sizeof(double) * iters);
  long warm = iters / 10;
  for (long i = 0; i < iters; i++) {
    double t0 = now();
#define SEND() (single ? sendmsg(s, &sm.msg_hdr, 0) : pattern ? sendmmsg(s, &sm, 1, 0) : send(s, tx, 52, 0))
    if (!server && SEND() < 0) return 1;
    for (;;) {
      int n;
      if (pattern == 0) {
        n = recv(s, rx[0], sizeof rx[0], MSG_DONTWAIT);
      } else if (single) {
        rm[0].msg_hdr.msg_control = ctl[0];
        rm[0].msg_hdr.msg_controllen = sizeof ctl[0];
        n = recvmsg(s, &rm[0].msg_hdr, MSG_DONTWAIT);
      } else {
        for (int k = 0; k < vlen; k++) {
          rm[k].msg_hdr.msg_control = ctl[k];
          rm[k].msg_hdr.msg_controllen = sizeof ctl[k];
        }
        n = recvmmsg(s, rm, vlen, MSG_DONTWAIT, NULL);
      }
      if (n > 0) break;
    }
    if (server && SEND() < 0) return 1;
    lat[i] = (now() - t0) * 1e6;
  }
  if (!server) {
    long n = iters - warm;
    qsort(lat + warm, n, sizeof(double), cmpd);
    printf("%.2f\n", lat[warm + n / 2]);
  }
  return 0;
}
