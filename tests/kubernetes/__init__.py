"""A Kubernetes API emulator for pitcrew's tests: kmock underneath, the apiserver rules pitcrew relies on on top."""
