// train: a process's session: the backends' process-wide set-up and the MPI world every rank of a
// job shares. Under mpirun (or srun) every rank runs the same command; launched alone, a session
// is a one-rank world that never touches MPI.
#pragma once
#include "comm/comm.h"

typedef struct weft_session weft_session;

// Call first thing in main(), before any thread exists: it may re-execute the process.
void weft_session_prepare_process(void);
// Starts the world (collective under MPI); argc/argv may be edited by MPI.
weft_session *weft_session_begin(int *argc, char ***argv);
void weft_session_end(weft_session *s);
weft_comm *weft_session_world(const weft_session *s);
// The rank that prints and writes files: rank 0 (every rank computes).
bool weft_session_writer(const weft_session *s);
