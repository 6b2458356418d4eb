#!/usr/bin/env python3
"""How long a causal attention grid takes in each block order, by list scheduling: the GPU starts
blocks in launch order, each on the first SM that frees (one block per SM, as the Hopper kernels
run), and a block of the forward takes as long as the key tiles its query rows see, plus one tile's
worth for its prologue and epilogue. Compares the order weft used until 2026-11-27 (each head's
query tiles last-first, one head after another) with the one it uses now (the heads fastest, the
tiles last-first: src/backend/cuda/attention.cuh's block_tile) and with the best list schedule
(every block of every head, longest first).

    python3 scripts/attention_block_order.py [--docs 2048,1024,512,512 4096 8192] [--heads 32]
        [--sms 132] [--rows 128] [--keys 128]

A model, not a measurement: it leaves out what differs between blocks besides their tile count
(the diagonal tile's masking, L2 hits) and assumes blocks start in launch order, which CUDA does
not promise but the hardware does.
"""
import argparse
import heapq


def makespan(blocks, sms, overhead=1.0):
    """When the last block ends, each block (its work in tiles) started on the first free SM."""
    free = [0.0] * sms
    for work in blocks:
        heapq.heappush(free, heapq.heappop(free) + work + overhead)
    return max(free)


def query_tiles(docs, rows, keys):
    """Per query tile of the packed documents, in order: the key tiles its last row sees."""
    out = []
    for length in docs:
        for i in range((length + rows - 1) // rows):
            out.append((min((i + 1) * rows, length) + keys - 1) // keys)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", nargs="+", default=["2048,1024,512,512", "4096", "8192", "16384"])
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--sms", type=int, default=132, help="H100 SXM: 132")
    p.add_argument("--rows", type=int, default=128, help="query rows a block (the forward's)")
    p.add_argument("--keys", type=int, default=128, help="keys a tile")
    a = p.parse_args()
    print(f"{'documents':<22} {'heads in turn':>13} {'heads fastest':>13} {'longest first':>13} "
          f"{'gain':>6}")
    for spec in a.docs:
        tiles = query_tiles([int(x) for x in spec.split(",")], a.rows, a.keys)
        in_turn = [w for _ in range(a.heads) for w in reversed(tiles)]
        fastest = [w for w in reversed(tiles) for _ in range(a.heads)]
        best = sorted(in_turn, reverse=True)
        t_turn, t_fast, t_best = (makespan(b, a.sms) for b in (in_turn, fastest, best))
        print(f"{spec:<22} {t_turn:13.0f} {t_fast:13.0f} {t_best:13.0f} "
              f"{100 * (t_turn / t_fast - 1):5.1f}%")
    print("(in tiles of work; gain: heads fastest over heads in turn)")


if __name__ == "__main__":
    main()
