"""What a run leaves for people: ``results.json`` (``results``, ``plain``), the report (``report``, ``pages``) and two results side by side (``compare``)."""
