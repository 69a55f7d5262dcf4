"""The fault suite: jobs in which a rank crashes, hangs, lies about its call or dies, each
checked for a loud error and no hang (:mod:`.suite` runs :mod:`.collective_cases`; the trainer's
option and record cases are :mod:`.option_cases` and :mod:`.records`).

Imports: anything below :mod:`experiments`, and the job control of :mod:`experiments`.
"""
