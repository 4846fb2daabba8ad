"""LIBERO's scripted experts: planners that read the simulator's privileged state (``base.Expert``), one per kind
of goal, composed per task from its BDDL goal by ``goals.make_expert``; ``episode`` runs them for ``ript collect``.

Modules, lower first (each imports only those above it): ``geometry`` (the hand, the scene's shapes, rotations),
``joints`` (articulations), ``push`` (pushing a part), ``leaning`` (a hand leaning into a push or a pull),
``articulated`` (open, close, turn on/off), ``fit`` (room in a walled region), ``pick_place``, ``drag``,
``slanted``, ``layers`` (a furniture's layer), ``turned_slide_in``, ``slide_in``, ``set_aside``, ``goals``,
``episode``.
"""
