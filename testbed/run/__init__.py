"""Run: a suite on a testbed, from its plan to the end of its ranks.

``plan`` renders a suite's steps, ranks and faults for the testbed's hosts into a ``testbed.records.RunPlan``
(pure data, the dry run); ``runner`` records a run and starts its detached ``supervisor``, which uploads, prepares,
launches, polls, fires ``faults``, recovers and runs post steps over ``remote`` (one SSH session per host per phase);
``state`` keeps plan files and reads and writes the run records (``models``) through the state store;
``campaign`` drives a matrix of runs.
"""
