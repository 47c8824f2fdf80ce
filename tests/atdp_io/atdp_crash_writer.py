"""Writer process for the crash test: appends forever, printing an ack after each durable call.

    python atdp_crash_writer.py ROOT sessions   # 4 threads of event-by-event sessions (serving)
    python atdp_crash_writer.py ROOT batch      # large whole trajectories (rollout)

Content is a deterministic function of the ids, so the test can check what survived.
"""

import sys
import threading

from atdp_factories import agent_trajectory

from atdp_io import AtdpStore

HELD = 10**6


def session_template(k: int):
    return agent_trajectory(f"s{k}", seed=k, turns=3, prompt_len=64)


def batch_template(k: int):
    return agent_trajectory(f"b{k}", seed=k, turns=20, prompt_len=20000, obs_len=2000, out_len=500)


def main(root: str, mode: str) -> None:
    store = AtdpStore.open(root)
    writer = store.writer("acme")
    print_lock = threading.Lock()

    def ack(line: str) -> None:
        with print_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def sessions(thread: int) -> None:
        for k in range(thread, 10**9, 4):
            template = session_template(k)
            session = writer.open_trajectory(template.header)
            ack(f"open s{k}")
            for i, event in enumerate(template.events):
                session.append_event(event)
                ack(f"event s{k} {i}")
            session.close(template.outcome)
            ack(f"close s{k}")

    if mode == "sessions":
        # One session stays open for the whole run, so the kill always interrupts one.
        held = session_template(HELD)
        writer.open_trajectory(held.header).append_event(held.events[0])
        ack(f"event s{HELD} 0")
        threads = [threading.Thread(target=sessions, args=(t,), daemon=True) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        upcoming = batch_template(0)
        for k in range(10**9):
            current, upcoming = upcoming, None
            writer.append([current])
            upcoming = batch_template(k + 1)  # built before the ack: after it, only writing
            ack(f"close b{k}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
