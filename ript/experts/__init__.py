"""Scripted demonstrations: an episode source per suite family (``metaworld``, ``libero``; registered in
``ript.registry.EXPERTS``), the LIBERO planners behind the ``Expert`` protocol (``base``), and resumable sharded
collection (``collect``)."""
