"""Fused trials: K trials of one model trained as one model whose weights carry a trial
dimension, one forward and one backward for the whole group (HFTA's horizontal fusion).

- `layers`: the model surgery. Every weight module of a transformers model (Linear, Embedding,
  LayerNorm) becomes its trial version holding K copies; the rows of a fused batch are the K
  trials' copies of one micro-batch, trial after trial, so every other module (attention,
  activations, pooling) runs on them unchanged.
- `update`: AdamW over the trial dimension, each trial with its own learning rate, schedule,
  weight decay and clipping norm, as `torch.optim.AdamW` + the HF schedule would step it alone.
- `group`: which trials can share a group (one line when they cannot) and the group's training
  loop: the step engine's batch plan and feeding, fused steps, fused validation at the rungs,
  and the halving that keeps the best trials' slices and drops the rest.
- `apart`: trials of different seeds in one group (the final check): each its own batches,
  stacked and padded to one shape, its own dropout stream and head init.
- `resume`: a group's state at a rung, whole or per trial, to go on from after a stop.
- `sizing`: how many trials fit: from measured memory on a GPU, from measured throughput on a
  CPU.

A group of one seed (the search's): the K trials then draw the same data order and the same
dropout masks alone, so the group draws each once, with the generator a trial alone would use,
and applies it to every trial. A group of several seeds (the final check's) draws each trial's
own (`apart`). That is what makes a fused trial equal to the same trial alone
(tests/train/test_trials.py checks the per-step losses and validation figures).
"""
