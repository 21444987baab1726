"""The Kubernetes API emulator the demo and the tests run: kmock's HTTP server with the apiserver
rules pitcrew relies on (``emulator``: store, verbs, eviction and PDBs, the CAPI/Karpenter/Job
controllers; ``resources``, ``patching``, ``selectors``: its pure rules; ``faults``: injected
errors and the request log), the API object shapes it is modelled on (``fixtures/``), and
``world``: the emulator in a thread with the GPU fleets the demo and the e2e tests seed.

Reached only over real HTTP by the real ``kubernetes.aio`` client of pitcrew's adapter. It imports
the ``kubernetes`` package's models only to refuse request bodies that are not valid objects.
"""
