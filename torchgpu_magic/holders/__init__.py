"""Who holds memory and what can be given back: the core of ``%gpumem holders``, ``%gpumem free`` and the
"who holds it" part of the out-of-memory explanation.

- :mod:`.holdings`: every storage the user's names, IPython's output history, a failed cell's frames and
  their autograd graphs keep alive, counted once, by holder; and what releasing a holder would free;
- :mod:`.graphs`: the tensors an autograd graph keeps alive, found without running anything;
- :mod:`.failed`: what keeps failed cells' frames alive (``sys.last_*``, earlier failed cells' errors);
- :mod:`.devicestate`: one device's memory read live (capacity, free, torch's allocator, other processes);
- :mod:`.report`: ``%gpumem holders``' report, per device, largest holder first;
- :mod:`.free`: ``%gpumem free``, each step's release measured before and after.

Reads only, but for :mod:`.free`, which lets go of the references its caller names. Nothing here keeps a
user object alive: reports hold names, strings and numbers. Modules are imported by name where used.
"""
