"""Checkpoints and stops: the checkpoint layout and its reads and writes (checkpoint), the
training state it holds (state) and every rank's random generators (random_state), one run's
store of them on a local folder or shared storage (store), which ones are kept (retention), and
a stop on SIGTERM/SIGINT that checkpoints the step under way first (preemption), and local
Ray's daemons kept out of that signal's process group (daemons).

The bottom of train/: imports nothing from the other train sub-packages."""
