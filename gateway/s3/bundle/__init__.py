"""Batch GET: ``POST /{bucket}?bundle`` answers many objects in one streaming TAR.

(Placeholder essay; filled in with the handler.)
"""
