/* MPI over whatever the launcher gives it (tests/ucx.rs: Open MPI's UCX layer on softhca0):
 * two-sided messages of 1 B to 4 MiB between ranks 0 and 1, each byte checked on both
 * sides (eager and rendezvous protocols alike); an Allreduce; one-sided puts into every
 * rank's window between fences. Rank 0 prints "mpi_check: ok" (or FAILED with the count of
 * bad bytes and values); every rank exits 0 only if all of it checked out. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned char pattern(size_t i, size_t len, int round)
{
	return (unsigned char)(i * 7 + len + (size_t)round);
}

int main(int argc, char **argv)
{
	int rank, size, bad = 0;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);

	/* Rank 0 sends a pattern, rank 1 checks it and sends it back with every byte + 1. */
	for (size_t len = 1; len <= (4u << 20); len *= 4) {
		unsigned char *b = malloc(len);
		if (!b)
			MPI_Abort(MPI_COMM_WORLD, 2);
		for (int round = 0; round < 3; round++) {
			if (rank == 0) {
				for (size_t i = 0; i < len; i++)
					b[i] = pattern(i, len, round);
				MPI_Send(b, (int)len, MPI_BYTE, 1, round, MPI_COMM_WORLD);
				MPI_Recv(b, (int)len, MPI_BYTE, 1, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (size_t i = 0; i < len; i++)
					bad += b[i] != (unsigned char)(pattern(i, len, round) + 1);
			} else if (rank == 1) {
				MPI_Recv(b, (int)len, MPI_BYTE, 0, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (size_t i = 0; i < len; i++) {
					bad += b[i] != pattern(i, len, round);
					b[i]++;
				}
				MPI_Send(b, (int)len, MPI_BYTE, 0, round, MPI_COMM_WORLD);
			}
		}
		free(b);
	}

	long v = rank + 1, sum = 0;
	MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	bad += sum != (long)size * (size + 1) / 2;

	/* One-sided: every rank puts its rank into slot `rank` of every window. */
	long *slots;
	MPI_Win win;
	MPI_Win_allocate(sizeof(long) * size, sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &slots, &win);
	for (int i = 0; i < size; i++)
		slots[i] = -1;
	MPI_Win_fence(0, win);
	long me = rank;
	for (int t = 0; t < size; t++)
		MPI_Put(&me, 1, MPI_LONG, t, rank, 1, MPI_LONG, win);
	MPI_Win_fence(0, win);
	for (int i = 0; i < size; i++)
		bad += slots[i] != i;
	MPI_Win_free(&win);

	int all = 0;
	MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0)
		printf("mpi_check: %s (%d ranks, %d bad)\n", all ? "FAILED" : "ok", size, all);
	MPI_Finalize();
	return all != 0;
}
