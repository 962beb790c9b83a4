"""The Ray Serve shell: the data plane through HAProxy, Serve's own cost per request, multi-node layouts."""
