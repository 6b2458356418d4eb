#include "train/session.h"

struct weft_session {
    weft_comm *world;
};

void weft_session_prepare_process(void) { weft_backend_prepare_process(); }

weft_session *weft_session_begin(int *argc, char ***argv) {
    weft_session *s = weft_alloc(sizeof *s);
    s->world = weft_comm_init(argc, argv);
    return s;
}

void weft_session_end(weft_session *s) {
    weft_comm_finalize(s->world);
    weft_free(s);
}

weft_comm *weft_session_world(const weft_session *s) { return s->world; }
bool weft_session_writer(const weft_session *s) { return weft_comm_rank(s->world) == 0; }
