"""The course's own tooling, apart from the library: exercise sheets generated from solutions and
the checks they call, offline slide decks, the lesson schedule, JupyterLab settings for the
lessons, and a JupyterHub on loopback (``localhub``).

Needs the ``course`` extra (``pip install packdata[course]``): jupytext, nbclient and nbconvert.
"""
