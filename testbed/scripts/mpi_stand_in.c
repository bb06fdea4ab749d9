/* testbed rehearse: the MPI program that stands in for a compiled rank under mpirun on a replica (its real binary
   needs what the replica lacks). It ignores its arguments, joins the job, says where each rank runs, and meets
   every other rank at a barrier, so mpirun, its hostfile and its network options run for real. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    int rank, size, len;
    char name[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(name, &len);
    printf("testbed rehearse: MPI stand-in rank %d of %d on %s\n", rank, size, name);
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
