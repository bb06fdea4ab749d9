/* testbed's MPI check: every rank prints its rank, the world size and its host name. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank = 0, size = 0, len = 0;
    char name[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(name, &len);
    MPI_Barrier(MPI_COMM_WORLD);
    printf("hello from rank %d of %d on %s\n", rank, size, name);
    MPI_Finalize();
    return 0;
}
