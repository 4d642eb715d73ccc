"""Game days: the incidents a run can meet (``incidents``), the drills that script them with a scorecard (``drills``, the shipped ones in ``drills/``) and how recovery is measured (``recovery``)."""
